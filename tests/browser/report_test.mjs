// Opens an HTML report from file:// in Chromium and drives it like a reader:
// sorts a numeric column both ways, filters by text and by verdict, opens a
// case's details and a model's drill-down, and saves a full-page screenshot.
// Fails on any console error, page error, dialog (an injected alert) or
// request that leaves the file.
//
//   node tests/browser/report_test.mjs REPORT.html
//
// Environment: REPORT_SCREENSHOT (default build/report_screenshot.png under
// the repository root), CHROMIUM (default /usr/bin/chromium), REPORT_FIXTURE=1
// for the fixture report_fixture_writer makes (it then also requires its
// failing models and hostile model id; any other report is checked for what
// it has).
// Needs Debian's chromium and tests/browser/node_modules: bash scripts/setup.sh.
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..', '..');
const howToInstall = 'run `bash scripts/setup.sh` (installs the chromium package and runs npm ci --prefix tests/browser)';

function die(message) {
  console.error(`report_in_chromium: FAIL: ${message}`);
  process.exit(1);
}

const reportPath = process.argv[2];
if (!reportPath) die('usage: node tests/browser/report_test.mjs REPORT.html');
if (!existsSync(reportPath)) die(`no report at ${reportPath} (report_fixture_writer writes it)`);
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
if (!existsSync(chromiumPath)) die(`Chromium is not installed at ${chromiumPath}; ${howToInstall}`);
let chromium;
try {
  ({ chromium } = await import('playwright-core'));
} catch (error) {
  die(`playwright-core is not installed in ${path.join(here, 'node_modules')}; ${howToInstall} (${error.message})`);
}
const screenshotPath = path.resolve(process.env.REPORT_SCREENSHOT || path.join(root, 'build', 'report_screenshot.png'));

const fixture = process.env.REPORT_FIXTURE === '1';
const problems = [];
function check(condition, message) {
  if (!condition) problems.push(message);
  return condition;
}

const browser = await chromium.launch({ executablePath: chromiumPath, headless: true });
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  page.on('console', (message) => {
    if (message.type() === 'error') problems.push(`console error: ${message.text()}`);
  });
  page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
  page.on('dialog', async (dialog) => {
    problems.push(`a dialog opened (injected script ran?): ${dialog.message()}`);
    await dialog.dismiss();
  });
  page.on('request', (request) => {
    const url = request.url();
    if (!url.startsWith('file:') && !url.startsWith('data:') && !url.startsWith('about:')) {
      problems.push(`the report requested ${url}`);
    }
  });

  await page.goto(pathToFileURL(path.resolve(reportPath)).href, { waitUntil: 'load' });
  await page.waitForSelector('#case-table tbody tr.case-row');

  const data = await page.evaluate(() => JSON.parse(document.getElementById('case-data').textContent));
  const field = Object.fromEntries(data.fields.map((name, i) => [name, i]));
  const total = data.cases.length;
  const pageSize = data.page_size;
  const countLabel = () => page.textContent('#case-count');
  const visibleRows = () => page.locator('#case-table tbody tr.case-row').count();
  const columnIndex = async (name) =>
    page.evaluate((name) => {
      const cells = Array.from(document.querySelectorAll('#case-table thead th'));
      return cells.findIndex((th) => th.dataset.field === name);
    }, name);
  const columnText = async (index) =>
    page.$$eval(`#case-table tbody tr.case-row td:nth-child(${index + 1})`, (cells) =>
      cells.map((c) => c.textContent),
    );

  check((await countLabel()) === `${total} of ${total} cases`, `initial count label: ${await countLabel()}`);
  check((await visibleRows()) === Math.min(total, pageSize), `initial rows: ${await visibleRows()}`);

  // Sort by a numeric column: ascending, then descending; cases without the
  // value go last both ways.
  const warm = await columnIndex('warm_us');
  const header = page.locator('#case-table thead th[data-field="warm_us"]');
  const values = data.cases.map((r) => r[field.warm_us]).filter((v) => typeof v === 'number');
  const expectFirstPage = (sorted) => {
    const numbers = sorted.slice(0, pageSize).map((v) => v.toFixed(1));
    while (numbers.length < Math.min(total, pageSize)) numbers.push('');
    return numbers;
  };
  await header.click();
  check((await header.getAttribute('aria-sort')) === 'ascending', 'aria-sort after one click is not ascending');
  const ascending = await columnText(warm);
  const expectedAscending = expectFirstPage([...values].sort((a, b) => a - b));
  check(
    JSON.stringify(ascending) === JSON.stringify(expectedAscending),
    `ascending warm latencies: got ${ascending.slice(0, 5)}..., want ${expectedAscending.slice(0, 5)}...`,
  );
  const numeric = ascending.filter((v) => v !== '').map(Number);
  check(
    numeric.every((v, i) => i === 0 || numeric[i - 1] <= v),
    'ascending order is not numeric (sorted as text?)',
  );
  await header.click();
  check((await header.getAttribute('aria-sort')) === 'descending', 'aria-sort after two clicks is not descending');
  const descending = await columnText(warm);
  const expectedDescending = expectFirstPage([...values].sort((a, b) => b - a));
  check(
    JSON.stringify(descending) === JSON.stringify(expectedDescending),
    `descending warm latencies: got ${descending.slice(0, 5)}..., want ${expectedDescending.slice(0, 5)}...`,
  );
  const others = await page.$$eval('#case-table thead th[data-field]', (cells) =>
    cells.filter((th) => th.dataset.field !== 'warm_us').map((th) => th.getAttribute('aria-sort')),
  );
  check(others.every((v) => v === 'none'), `other headers' aria-sort: ${others}`);

  // Filter by text: op, summary, error, models and key, ignoring case.
  const query = fixture ? 'softmax' : String(data.cases[0][field.op]).replace(/^aten::/, '').split('.')[0].toLowerCase();
  const matching = data.cases.filter((r) =>
    [r[field.op], r[field.summary], r[field.error], r[field.models], r[field.key]]
      .join('\n')
      .toLowerCase()
      .includes(query),
  ).length;
  check(matching > 0 && (matching < total || !fixture), `the report should have some ${query} cases, has ${matching}`);
  await page.fill('#case-filter', query);
  check((await countLabel()) === `${matching} of ${total} cases`, `count after filter: ${await countLabel()}`);
  check((await visibleRows()) === Math.min(matching, pageSize), `rows after filter: ${await visibleRows()}`);
  await page.fill('#case-filter', '');
  check((await countLabel()) === `${total} of ${total} cases`, `count after clearing: ${await countLabel()}`);

  // Filter by verdict.
  const verdict = data.cases.some((r) => r[field.verdict] === 'crash') ? 'crash' : data.cases[0][field.verdict];
  const withVerdict = data.cases.filter((r) => r[field.verdict] === verdict).length;
  await page.selectOption('#verdict-filter', verdict);
  check(
    (await countLabel()) === `${withVerdict} of ${total} cases`,
    `count with verdict ${verdict}: ${await countLabel()}, want ${withVerdict}`,
  );
  const verdicts = await columnText(await columnIndex('verdict'));
  check(verdicts.length > 0 && verdicts.every((v) => v === verdict), `rows with other verdicts: ${verdicts}`);

  // A case's details.
  await page.locator('#case-table tbody tr.case-row button.toggle').first().click();
  const detail = page.locator('#case-table tbody tr.case-detail').first();
  check(await detail.isVisible(), 'the case details did not open');
  check((await detail.textContent()).includes('coverage --registry'), 'the case details show no repro command');
  await page.selectOption('#verdict-filter', '');

  // A failing model's drill-down: failing items and root-cause op cases.
  const model = page.locator('#model-table tbody tr.failing details').first();
  if (fixture || (await model.count()) > 0) {
    check((await model.count()) === 1, 'no failing model in the models table');
    await model.locator('summary').click();
    check((await model.getAttribute('open')) !== null, 'the model details did not open');
    const drill = model.locator('table.drill').first();
    check(await drill.isVisible(), 'the model details show no table');
  }

  // "What is broken" comes first, above the summary, and its case links
  // fill the case filter.
  const order = await page.evaluate(() => {
    const sections = Array.from(document.querySelectorAll('main > section')).map((s) => s.id);
    return sections;
  });
  check(order[0] === 'broken', `the first section is ${order[0]}, not "What is broken"`);
  const brokenOps = page.locator('#broken-ops tbody tr');
  const failingCases = data.cases.filter((r) => !['pass', 'skipped', 'expected_failure', 'unexpected_pass', 'removed']
    .includes(r[field.verdict])).length;
  if (fixture || failingCases > 0) {
    check((await brokenOps.count()) > 0, 'failing cases, but "What is broken" groups none');
    const link = brokenOps.first().locator('a.case-link').first();
    const op = (await brokenOps.first().locator('td').first().textContent()).trim();
    await link.click();
    await page.waitForFunction((op) => document.getElementById('case-filter').value === op, op);
    const ops = await columnText(await columnIndex('op'));
    check(ops.length > 0 && ops.every((v) => v.includes(op)), `the ${op} link shows other ops: ${ops.slice(0, 5)}`);
    await page.fill('#case-filter', '');
    await page.dispatchEvent('#case-filter', 'input');
  }
  if (fixture) {
    const divergent = await page.locator('#broken-models td', { hasText: 'model.layers.0.self_attn' }).count();
    check(divergent > 0, "the first divergent calls of the fixture's mismatching models are not shown");
    check((await page.locator('#pipeline li').count()) === 4, 'the pipeline strip does not list crawl, selection, capture and stages');
  }

  // Hostile strings are shown as text.
  if (fixture) {
    const hostile = await page.locator('#model-table summary', { hasText: '<script>alert(1)</script>' }).count();
    check(hostile === 1, `the <script> model id is not shown as text (${hostile} summaries)`);
  }

  // From the top: a sticky header otherwise sticks to where the page was scrolled.
  await page.evaluate(() => window.scrollTo(0, 0));
  // Wide tables stay inside the page: nothing scrolls sideways at 1400 px.
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  const wide = overflow <= 0 ? [] : await page.evaluate(() => [...document.querySelectorAll('table')]
    .filter((t) => t.getBoundingClientRect().right > window.innerWidth).map((t) => t.id || t.className || 'table'));
  check(overflow <= 0, `the page is ${overflow} px wider than the 1400 px window (${wide.join(', ') || 'not a table'})`);
  await page.screenshot({ path: screenshotPath, fullPage: true });
  console.log(`report_in_chromium: screenshot at ${screenshotPath}`);
} finally {
  await browser.close();
}

if (problems.length > 0) {
  die(`${problems.length} problem(s):\n  ${problems.join('\n  ')}`);
}
console.log('report_in_chromium: ok (what is broken first and its case links, sort both ways, text and verdict filters, case and model details)');
