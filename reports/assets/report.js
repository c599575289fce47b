(function () {
  'use strict';
  const data = JSON.parse(document.getElementById('case-data').textContent);
  const F = {};
  data.fields.forEach(function (name, i) { F[name] = i; });
  const rows = data.cases;
  const pageSize = data.page_size;
  const haystack = rows.map(function (r) {
    return [r[F.op], r[F.summary], r[F.error], r[F.models], r[F.key]].join('\n').toLowerCase();
  });
  const table = document.getElementById('case-table');
  const tbody = table.tBodies[0];
  const headers = Array.prototype.slice.call(table.tHead.rows[0].cells);
  const filterBox = document.getElementById('case-filter');
  const verdictSelect = document.getElementById('verdict-filter');
  const changeSelect = document.getElementById('change-filter');
  const countLabel = document.getElementById('case-count');
  const pageInfo = document.getElementById('page-info');
  const prev = document.getElementById('page-prev');
  const next = document.getElementById('page-next');
  let order = rows.map(function (_, i) { return i; });
  let visible = order;
  let page = 0;
  let sortField = null;
  let sortDirection = 1;
  const open = new Set();

  function asNumber(v) {
    if (typeof v === 'number') return v;
    if (v === 'inf') return Infinity;
    if (v === '-inf') return -Infinity;
    if (v === 'nan') return NaN;
    return null;
  }
  function formatNumber(v, field) {
    const n = asNumber(v);
    if (n === null) return '';
    if (!isFinite(n)) return String(v);
    if (field === 'attempts' || field === 'model_count') return String(n);
    if (field === 'warm_us' || field === 'baseline_warm_us') return n.toFixed(1);
    const magnitude = Math.abs(n);
    return magnitude !== 0 && (magnitude < 1e-3 || magnitude >= 1e5) ? n.toExponential(2) : String(+n.toPrecision(3));
  }
  function text(tag, content, className) {
    const node = document.createElement(tag);
    node.textContent = content;
    if (className) node.className = className;
    return node;
  }
  function verdictClass(v) {
    if (v === 'pass') return 'v-pass';
    if (v === 'expected_failure') return 'v-xfail';
    if (v === 'unexpected_pass') return 'v-xpass';
    if (v === 'skipped') return 'v-skip';
    return 'v-fail';
  }
  function copy(textToCopy, button) {
    const done = function () { button.textContent = 'Copied'; };
    const fail = function () { button.textContent = 'Select and copy'; };
    try {
      if (navigator.clipboard && navigator.clipboard.writeText) {
        navigator.clipboard.writeText(textToCopy).then(done, fail);
      } else {
        fail();
      }
    } catch (e) {
      fail();
    }
  }
  function detailRow(r) {
    const tr = document.createElement('tr');
    tr.className = 'case-detail';
    const td = document.createElement('td');
    td.colSpan = headers.length;
    const dl = document.createElement('dl');
    function item(label, value, pre) {
      if (value === null || value === undefined || value === '' ||
          (Array.isArray(value) && value.length === 0)) return;
      dl.appendChild(text('dt', label));
      const dd = document.createElement('dd');
      dd.appendChild(text(pre ? 'pre' : 'span', Array.isArray(value) ? value.join(', ') : String(value),
                          pre ? 'error' : ''));
      dl.appendChild(dd);
    }
    item('Key', r[F.key]);
    item('Run', r[F.run_id]);
    item('Outcome', r[F.outcome]);
    item('Expectation', r[F.expectation]);
    item('Error', r[F.error], true);
    item('Change', r[F.change_detail]);
    item('Also', r[F.extra_changes]);
    item('Baseline outcome', r[F.baseline_outcome]);
    let attempts = String(r[F.attempts]);
    if (r[F.attempt_outcomes]) attempts += ' (' + r[F.attempt_outcomes] + ')';
    if (r[F.flaky]) attempts += ', flaky';
    item('Attempts', attempts);
    item('First call (us)', formatNumber(r[F.first_call_us], 'warm_us'));
    item('Warm spread (us)', formatNumber(r[F.warm_spread_us], 'warm_us'));
    item('Mismatch fraction', formatNumber(r[F.mismatch_frac]));
    item('Cosine', formatNumber(r[F.cosine]));
    let counters = r[F.counters_json];
    if (counters) {
      try { counters = JSON.stringify(JSON.parse(counters), null, 1); } catch (e) { /* shown as stored */ }
    }
    item('Counters', counters, true);
    item('Models', r[F.models]);
    item('Families', r[F.families]);
    item('OpInfo samples', r[F.opinfos]);
    if (r[F.repro]) {
      dl.appendChild(text('dt', 'Repro'));
      const dd = document.createElement('dd');
      const code = text('code', r[F.repro], 'repro');
      const button = text('button', 'Copy', 'copy');
      button.type = 'button';
      button.addEventListener('click', function () { copy(code.textContent, button); });
      dd.appendChild(code);
      dd.appendChild(document.createTextNode(' '));
      dd.appendChild(button);
      dl.appendChild(dd);
    }
    td.appendChild(dl);
    tr.appendChild(td);
    return tr;
  }
  function render() {
    const pages = Math.max(1, Math.ceil(visible.length / pageSize));
    page = Math.min(page, pages - 1);
    const start = page * pageSize;
    const fragment = document.createDocumentFragment();
    visible.slice(start, start + pageSize).forEach(function (index) {
      const r = rows[index];
      const tr = document.createElement('tr');
      tr.className = 'case-row';
      const toggleCell = document.createElement('td');
      const toggle = text('button', open.has(index) ? '-' : '+', 'toggle');
      toggle.type = 'button';
      toggle.setAttribute('aria-expanded', open.has(index) ? 'true' : 'false');
      toggle.setAttribute('aria-label', 'Details');
      toggle.addEventListener('click', function () {
        if (open.has(index)) open.delete(index); else open.add(index);
        render();
      });
      toggleCell.appendChild(toggle);
      tr.appendChild(toggleCell);
      headers.slice(1).forEach(function (th) {
        const field = th.dataset.field;
        const value = r[F[field]];
        if (th.dataset.type === 'number') {
          tr.appendChild(text('td', formatNumber(value, field), 'num'));
        } else if (field === 'verdict') {
          const td = document.createElement('td');
          td.appendChild(text('span', value, 'badge ' + verdictClass(value)));
          tr.appendChild(td);
        } else if (field === 'op') {
          const td = document.createElement('td');
          td.appendChild(text('code', value));
          tr.appendChild(td);
        } else {
          tr.appendChild(text('td', value));
        }
      });
      fragment.appendChild(tr);
      if (open.has(index)) fragment.appendChild(detailRow(r));
    });
    tbody.textContent = '';
    tbody.appendChild(fragment);
    countLabel.textContent = visible.length + ' of ' + rows.length + ' cases';
    pageInfo.textContent = 'page ' + (page + 1) + ' of ' + pages;
    prev.disabled = page === 0;
    next.disabled = page >= pages - 1;
  }
  function applyFilters() {
    const query = filterBox.value.trim().toLowerCase();
    const verdict = verdictSelect.value;
    const change = changeSelect.value;
    visible = order.filter(function (i) {
      const r = rows[i];
      if (verdict && r[F.verdict] !== verdict) return false;
      if (change && r[F.change] !== change && r[F.extra_changes].indexOf(change) < 0) return false;
      return !query || haystack[i].indexOf(query) >= 0;
    });
    render();
  }
  function compare(field, numeric) {
    const column = F[field];
    return function (a, b) {
      let x = rows[a][column], y = rows[b][column];
      if (numeric) {
        x = asNumber(x); y = asNumber(y);
        if (x !== null && isNaN(x)) x = Infinity;
        if (y !== null && isNaN(y)) y = Infinity;
        // Cases without the value go last in both directions.
        if (x === null || y === null) return x === y ? a - b : (x === null ? 1 : -1);
        if (x !== y) return x < y ? -sortDirection : sortDirection;
        return a - b;
      }
      x = String(x); y = String(y);
      if (x !== y) return x < y ? -sortDirection : sortDirection;
      return a - b;
    };
  }
  function sortBy(th) {
    const field = th.dataset.field;
    if (sortField === field) {
      sortDirection = -sortDirection;
    } else {
      sortField = field;
      sortDirection = 1;
    }
    order = rows.map(function (_, i) { return i; });
    order.sort(compare(field, th.dataset.type === 'number'));
    headers.forEach(function (h) {
      if (!h.dataset.field) return;
      h.setAttribute('aria-sort', h === th ? (sortDirection > 0 ? 'ascending' : 'descending') : 'none');
    });
    page = 0;
    applyFilters();
  }
  headers.forEach(function (th) {
    if (!th.dataset.field) return;
    th.addEventListener('click', function () { sortBy(th); });
    th.addEventListener('keydown', function (event) {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        sortBy(th);
      }
    });
  });
  filterBox.addEventListener('input', function () { page = 0; applyFilters(); });
  verdictSelect.addEventListener('change', function () { page = 0; applyFilters(); });
  changeSelect.addEventListener('change', function () { page = 0; applyFilters(); });
  prev.addEventListener('click', function () { page -= 1; render(); });
  next.addEventListener('click', function () { page += 1; render(); });
  document.querySelectorAll('code.repro + button.copy').forEach(function (button) {
    button.addEventListener('click', function () { copy(button.previousElementSibling.textContent, button); });
  });
  // Note [Case links]: "#case-filter=<percent-encoded text>" (the links of
  // "What is broken") fills the case filter and shows the case table.
  function followCaseLink() {
    const prefix = '#case-filter=';
    if (location.hash.indexOf(prefix) !== 0) return false;
    let wanted = '';
    try {
      wanted = decodeURIComponent(location.hash.slice(prefix.length));
    } catch (e) {
      return false;
    }
    filterBox.value = wanted;
    verdictSelect.value = '';
    changeSelect.value = '';
    page = 0;
    applyFilters();
    document.getElementById('cases').scrollIntoView();
    return true;
  }
  window.addEventListener('hashchange', followCaseLink);
  if (!followCaseLink()) applyFilters();
})();
