#!/usr/bin/env python3
"""Makes models.jsonl and redirects.json in this folder from shared/data/hub/.

Run from the repository root:  python3 data/hub/trim.py ../shared/data/hub
Deterministic: the same inputs give byte-identical outputs. See README.md.
"""
import glob
import json
import os
import sys

KEPT = ["_id", "id", "author", "sha", "created_at", "last_modified", "private", "gated", "disabled",
        "downloads", "likes", "library_name", "tags", "pipeline_tag"]
WIRE = {"createdAt": "created_at", "lastModified": "last_modified"}  # api_samples use the wire names


def trim(record, source):
    out = {k: record.get(k) for k in KEPT}
    config = record.get("config") or {}
    subset = {k: config[k] for k in ("architectures", "model_type") if k in config}
    out["config"] = subset or None
    out["source"] = source
    return out


def main(shared):
    here = os.path.dirname(os.path.abspath(__file__))
    samples = os.path.join(shared, "api_samples")
    sources = {}
    for line in open(os.path.join(samples, "SOURCES.md"), encoding="utf-8"):
        cells = [c.strip().replace("`", "") for c in line.split("|")]
        if len(cells) > 6 and cells[1].startswith("hfhub_"):
            sources[cells[1]] = "huggingface_hub %s @ %s (%s), copied as shared/data/hub/api_samples/%s" % (
                cells[4], cells[5], cells[3] and "GET " + cells[2], cells[1])

    # Real /api/models/{id} bodies: the latest recording of each id with full fields.
    latest = {}
    for path in sorted(glob.glob(os.path.join(samples, "*__200__*.json"))):
        if path.endswith(".meta.json"):
            continue
        body = json.load(open(path, encoding="utf-8"))
        if "author" not in body:
            continue  # expand-only bodies carry just _id and id
        meta = json.load(open(path[:-5] + ".meta.json", encoding="utf-8"))
        date = meta["headers"].get("Date", [""])[0]
        stamp = (date[12:16] + date[8:11] + date[5:7] + date[17:25]) if date else ""
        key = body["id"]
        if key not in latest or stamp > latest[key][0]:
            for wire, snake in WIRE.items():
                body[snake] = body.get(wire)
            latest[key] = (stamp, trim(body, sources[os.path.basename(path)]))

    rows = []
    seen = set()
    for line in open(os.path.join(shared, "model_metadata_sample.jsonl"), encoding="utf-8"):
        r = json.loads(line)
        if r["id"] in latest:
            continue  # the recorded wire response wins
        rows.append(trim(r["metadata"], r["source"]))
        seen.add(r["id"])
    for key in sorted(latest):
        rows.append(latest[key][1])
    with open(os.path.join(here, "models.jsonl"), "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")

    redirects = {}
    for meta_path in sorted(glob.glob(os.path.join(samples, "*__307__*.meta.json"))):
        meta = json.load(open(meta_path, encoding="utf-8"))
        uri = meta["request"]["uri"].split("?")[0]
        old = uri.split("/api/models/", 1)[1]
        new = meta["headers"]["Location"][0].split("?")[0].split("/api/models/", 1)[1]
        name = os.path.basename(meta_path)[: -len(".meta.json")] + ".txt"
        entry = redirects.setdefault(old, {"from": old, "to": new, "status": meta["status"]["code"], "recorded": []})
        entry["recorded"].append({"request": meta["request"]["uri"], "location": meta["headers"]["Location"][0],
                                  "source": sources[name]})
    with open(os.path.join(here, "redirects.json"), "w", encoding="utf-8") as f:
        json.dump({"redirects": [redirects[k] for k in sorted(redirects)]}, f, indent=2, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/hub")
