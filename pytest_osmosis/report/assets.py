"""The report's stylesheet and script, inlined into every report (no CDN, no network).

The script only reads the embedded JSON and builds DOM nodes with ``textContent``:
nothing from a run directory is ever parsed as HTML.
"""

from __future__ import annotations

CSS = r"""
:root{--fg:#1f2328;--muted:#656d76;--line:#d0d7de;--bg:#f6f8fa;--card:#fff;
--pass:#2b8a3e;--below:#e67700;--fail:#c92a2a;--skip:#868e96;--accent:#1c7ed6}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
color:var(--fg);background:var(--bg)}
main{max-width:1360px;margin:0 auto;padding:18px 22px 40px}
h1{font-size:22px;margin:0 8px 0 0;display:inline-block;word-break:break-all}
h2{font-size:16px;margin:26px 0 10px}
header .meta{color:var(--muted);margin-top:6px}
header .meta span{margin-right:14px;white-space:nowrap}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;
vertical-align:middle;background:#e9ecef;color:#495057}
.badge.finished,.o-passed{background:#d3f9d8;color:var(--pass)}
.badge.incomplete,.badge.running,.o-below_threshold{background:#fff3bf;color:var(--below)}
.o-failed{background:#ffe3e3;color:var(--fail)}
.o-skipped{background:#e9ecef;color:var(--skip)}
.warn{background:#fff9db;border:1px solid #ffe066;border-radius:6px;padding:8px 12px;margin:10px 0}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(200px,1fr));gap:12px;margin-top:16px}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:12px 14px}
.card .label{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.card .value{font-size:26px;font-weight:650;margin:2px 0}
.card .sub{color:var(--muted);font-size:12.5px}
.card .value.good{color:var(--pass)}.card .value.bad{color:var(--fail)}
.stack{display:flex;height:10px;border-radius:5px;overflow:hidden;margin:8px 0 6px;background:#eee}
.stack i{display:block}
.stack .passed{background:var(--pass)}.stack .below_threshold{background:var(--below)}
.stack .failed{background:var(--fail)}.stack .skipped{background:var(--skip)}
.legend span{margin-right:10px;white-space:nowrap}
.dot{display:inline-block;width:9px;height:9px;border-radius:50%;margin-right:4px}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:12px}
figure{margin:0;background:var(--card);border:1px solid var(--line);border-radius:8px;
padding:8px 10px}
figcaption{font-weight:600;margin-bottom:2px}
figcaption small{font-weight:400;color:var(--muted);margin-left:6px}
svg.plot{width:100%;height:auto;display:block}
svg .grid{stroke:#eceff1}svg .axis{stroke:#adb5bd}
svg .tick,svg .axis-label,svg .note,svg .marker-label{font-size:11px;fill:var(--muted)}
svg .empty{font-size:13px;fill:var(--muted)}
svg .bar.pass{fill:var(--pass)}svg .bar.fail{fill:var(--fail)}svg .bar.mixed{fill:var(--below)}
svg .bar.neutral{fill:var(--accent)}svg .bar.none{fill:var(--skip)}
svg .bar:hover{opacity:.75}
svg .line{fill:none;stroke:var(--accent);stroke-width:2}
svg .point{fill:var(--accent)}svg .marker{stroke:#495057;stroke-dasharray:4 3}
.filters{display:flex;flex-wrap:wrap;gap:10px;align-items:center;margin-bottom:8px}
.filters label{color:var(--muted);font-size:12.5px}
.filters input,.filters select{font:inherit;padding:4px 6px;border:1px solid var(--line);
border-radius:6px;background:#fff}
.filters input[type=number]{width:76px}
.filters input[type=search]{width:260px}
#count{color:var(--muted);margin-left:auto}
.tablewrap{background:var(--card);border:1px solid var(--line);border-radius:8px;overflow:auto;
max-height:70vh}
table{border-collapse:collapse;width:100%}
th,td{padding:6px 10px;border-bottom:1px solid #eef1f4;text-align:left;white-space:nowrap}
th{position:sticky;top:0;background:#f1f3f5;font-size:12.5px;cursor:pointer;user-select:none}
th[aria-sort=ascending]::after{content:" \25B2";font-size:9px}
th[aria-sort=descending]::after{content:" \25BC";font-size:9px}
td.num,th.num{text-align:right}
tbody tr{cursor:pointer}tbody tr:hover{background:#f1f8ff}
tbody tr.selected{background:#e7f5ff}
tbody tr:focus{outline:2px solid var(--accent);outline-offset:-2px}
.pill{display:inline-block;padding:0 7px;border-radius:9px;font-size:12px;font-weight:600}
#detail{position:fixed;top:0;right:0;bottom:0;width:min(640px,46vw);background:#fff;
border-left:1px solid var(--line);box-shadow:-6px 0 24px rgba(0,0,0,.08);overflow:auto;
padding:16px 20px 40px;z-index:10}
#detail[hidden]{display:none}
#detail.wide{width:min(920px,62vw)}
#detail h3{margin:0 0 4px;font-size:18px}
#detail h4{margin:18px 0 6px;font-size:14px}
#close{float:right;font:inherit;border:1px solid var(--line);background:#fff;border-radius:6px;
padding:2px 10px;cursor:pointer}
.kv{color:var(--muted)}.kv b{color:var(--fg);font-weight:600;margin-right:12px}
.step{border:1px solid var(--line);border-radius:8px;margin:8px 0;overflow:hidden}
.step-head{background:#f8f9fa;padding:4px 10px;font-size:12.5px;color:var(--muted)}
.step-head .src{font-weight:700;color:var(--fg);text-transform:uppercase;font-size:11.5px;
margin-right:8px}
.step.agent .step-head{background:#e7f5ff}.step.system .step-head{background:#f3f0ff}
.step pre,.error pre,.artifact pre{margin:0;padding:8px 10px;white-space:pre-wrap;
word-break:break-word;max-height:420px;overflow:auto}
.tool{border-top:1px dashed var(--line);padding:4px 10px}
.tool .name{font-weight:600}
.obs{border-top:1px dashed var(--line);background:#fcfcfc}
.error{border:1px solid #ffc9c9;background:#fff5f5;border-radius:8px;padding:8px 10px}
.artifact{border:1px solid var(--line);border-radius:8px;margin:6px 0}
.artifact summary{padding:4px 10px;cursor:pointer}
.muted{color:var(--muted)}
.cmp td,.cmp th{white-space:normal}
td.clip,th.clip{max-width:26ch;overflow:hidden;text-overflow:ellipsis}
td.clip.short,th.clip.short{max-width:12ch}
@media (max-width:1600px){#rows td.clip,#rows th.clip{max-width:16ch}
#rows td.clip.short,#rows th.clip.short{max-width:10ch}}
#row-by-row td.clip{max-width:44ch}
pre.field{margin:0;padding:8px 10px;white-space:pre-wrap;word-break:break-word;max-height:320px;
overflow:auto;border:1px solid var(--line);border-radius:8px;background:#fcfcfc}
pre.field.answer{background:#f4fbff}pre.field.explanation{background:#fffdf4}
.step.user .step-head{background:#f1f3f5}
.sides{display:grid;grid-template-columns:1fr 1fr;gap:10px;margin-top:10px}
.side h4{margin:6px 0;word-break:break-all}
.attempt{border:1px solid var(--line);border-radius:8px;margin:6px 0;overflow:hidden}
.attempt pre{margin:0;padding:6px 10px;white-space:pre-wrap;word-break:break-word}
.attempt pre.explanation{border-top:1px dashed var(--line);background:#fffdf4;color:#5c4a00}
.attempt .error{border-radius:0;border-width:1px 0 0}
.c-regressed{background:#ffe3e3;color:var(--fail)}.c-improved{background:#d3f9d8;color:var(--pass)}
.c-unchanged,.c-only_current,.c-only_baseline{background:#e9ecef;color:#495057}
.delta-up{color:var(--pass)}.delta-down{color:var(--fail)}
footer{color:var(--muted);font-size:12px;margin-top:26px}
svg .s1{--c:#e8590c}svg .s2{--c:#2f9e44}svg .s3{--c:#ae3ec9}svg .s4{--c:#0c8599}
svg .s5{--c:#868e96}
svg .line.s0,svg .line.s1,svg .line.s2,svg .line.s3,svg .line.s4,
svg .line.s5{stroke:var(--c,var(--accent))}
svg .point.s1,svg .point.s2,svg .point.s3,svg .point.s4,svg .point.s5{fill:var(--c)}
svg .legend-entry{font-size:11.5px;fill:var(--c,var(--accent))}
svg a .point:hover{r:6}
#over-time svg.plot{max-width:900px}
"""

JS = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var rows = data.rows;
  var words = data.words || {};
  var inputs = data.inputs || [];
  var byKey = {};
  function inputOf(r) { return (r.ii || []).map(function (i) { return inputs[i]; }); }
  rows.forEach(function (r) {
    byKey[r.r + "." + r.n] = r;
    var said = inputOf(r).map(function (m) { return m[1]; });
    r.q = [r.q].concat(said, [r.lab || "", r.ans || "", r.expl || ""]).join(" ").toLowerCase();
  });
  var table = document.getElementById("rows");
  var tbody = table.tBodies[0];
  var trs = Array.prototype.slice.call(tbody.rows);
  var fOutcome = document.getElementById("f-outcome");
  var fError = document.getElementById("f-error");
  var fMin = document.getElementById("f-min");
  var fMax = document.getElementById("f-max");
  var fSearch = document.getElementById("f-search");
  var count = document.getElementById("count");
  var drawer = document.getElementById("detail");
  var body = document.getElementById("detail-body");

  function num(input) {
    var v = input.value.trim();
    return v === "" ? null : Number(v);
  }
  function matches(r) {
    var o = fOutcome.value;
    if (o === "not_passed") {
      if (r.outcome !== "failed" && r.outcome !== "below_threshold") return false;
    } else if (o && r.outcome !== o) {
      return false;
    }
    var e = fError.value;
    if (e && (r.err || "") !== e) return false;
    var lo = num(fMin), hi = num(fMax);
    if (lo !== null || hi !== null) {
      if (typeof r.reward !== "number") return false;
      if (lo !== null && !(r.reward >= lo)) return false;
      if (hi !== null && !(r.reward <= hi)) return false;
    }
    var q = fSearch.value.trim().toLowerCase();
    if (q) {
      var terms = q.split(/\s+/);
      for (var i = 0; i < terms.length; i++) if (r.q.indexOf(terms[i]) < 0) return false;
    }
    return true;
  }
  function applyFilters() {
    var shown = 0;
    trs.forEach(function (tr) {
      var ok = matches(rows[Number(tr.getAttribute("data-i"))]);
      tr.hidden = !ok;
      if (ok) shown++;
    });
    count.textContent = shown + " of " + rows.length + " attempts shown";
  }
  [fOutcome, fError].forEach(function (el) { el.addEventListener("change", applyFilters); });
  [fMin, fMax, fSearch].forEach(function (el) { el.addEventListener("input", applyFilters); });

  var order = {passed: 0, below_threshold: 1, failed: 2, skipped: 3};
  function sortValue(r, key) {
    if (key === "outcome") return order[r.outcome];
    var v = r[key];
    if (v === undefined || v === null) return null;
    return v;
  }
  function cellText(tr, index) {
    var text = tr.cells[index].textContent.trim().toLowerCase();
    return text === "" ? null : text;
  }
  Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) {
    th.addEventListener("click", function () {
      var key = th.getAttribute("data-sort");
      var byText = th.classList.contains("clip");
      var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (c) {
        c.removeAttribute("aria-sort");
      });
      th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
      trs.sort(function (a, b) {
        var ra = rows[Number(a.getAttribute("data-i"))];
        var rb = rows[Number(b.getAttribute("data-i"))];
        var va = byText ? cellText(a, th.cellIndex) : sortValue(ra, key);
        var vb = byText ? cellText(b, th.cellIndex) : sortValue(rb, key);
        if (va === vb) return ra.i - rb.i;
        if (va === null) return 1;
        if (vb === null) return -1;
        return (va < vb ? -1 : 1) * dir;
      });
      trs.forEach(function (tr) { tbody.appendChild(tr); });
    });
  });

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function add(parent, child) { parent.appendChild(child); return child; }
  function kv(parent, pairs) {
    var p = add(parent, el("div", "kv"));
    pairs.forEach(function (pair) {
      if (pair[1] === undefined || pair[1] === null || pair[1] === "") return;
      p.appendChild(document.createTextNode(pair[0] + " "));
      add(p, el("b", null, pair[1]));
    });
    return p;
  }
  function fmtReward(v) { return typeof v === "number" ? v.toFixed(3) : "–"; }
  function fmtMs(v) {
    if (typeof v !== "number") return "–";
    return v >= 1000 ? (v / 1000).toFixed(2) + " s" : v.toFixed(0) + " ms";
  }
  function fmtSize(n) {
    if (n >= 1048576) return (n / 1048576).toFixed(1) + " MB";
    return n >= 1024 ? (n / 1024).toFixed(1) + " KB" : n + " B";
  }
  function link(href, text) {
    var a = el("a", null, text);
    a.setAttribute("href", href);
    return a;
  }
  function renderStep(step) {
    var box = el("div", "step " + step.source);
    var head = add(box, el("div", "step-head"));
    add(head, el("span", "src", step.source || "?"));
    var bits = ["step " + step.id];
    if (step.model_name) bits.push(step.model_name);
    if (step.metrics) {
      var m = step.metrics;
      var tok = [];
      if (m.prompt_tokens !== undefined) tok.push(m.prompt_tokens + " prompt");
      if (m.completion_tokens !== undefined) tok.push(m.completion_tokens + " completion");
      if (m.cached_tokens !== undefined) tok.push(m.cached_tokens + " cached");
      if (tok.length) bits.push("tokens: " + tok.join(" / "));
      if (m.cost_usd !== undefined) bits.push("$" + m.cost_usd);
    }
    if (step.timestamp) bits.push(step.timestamp);
    head.appendChild(document.createTextNode(bits.join(" · ")));
    if (step.reasoning) {
      var det = add(box, el("details"));
      add(det, el("summary", "muted", "reasoning"));
      add(det, el("pre", null, step.reasoning));
    }
    if (step.text) add(box, el("pre", "msg", step.text));
    (step.tools || []).forEach(function (t) {
      var tool = add(box, el("div", "tool"));
      add(tool, el("span", "name", "tool call " + t.name));
      if (t.id) add(tool, el("span", "muted", "  " + t.id));
      add(tool, el("pre", "mono", t.args));
    });
    (step.obs || []).forEach(function (o) {
      var obs = add(box, el("div", "obs"));
      add(obs, el("div", "tool muted", "observation" + (o.id ? " for " + o.id : "")));
      add(obs, el("pre", null, o.text));
    });
    return box;
  }
  function fmtCost(v) { return typeof v === "number" ? "$" + v.toFixed(4) : null; }
  function renderInput(parent, r) {
    add(parent, el("h4", null, "Input"));
    var box = add(parent, el("div", "input"));
    var messages = inputOf(r);
    if (!messages.length) {
      add(box, el("div", "muted", "Not known: no trajectory, and the dataset file was not found."));
      return;
    }
    messages.forEach(function (m) {
      var step = add(box, el("div", "step " + m[0]));
      add(add(step, el("div", "step-head")), el("span", "src", m[0]));
      add(step, el("pre", "in-msg", m[1]));
    });
    if (r.in_src) add(box, el("div", "muted", "from the " + r.in_src));
  }
  function renderText(parent, title, text, cls) {
    if (!text) return;
    add(parent, el("h4", null, title));
    add(parent, el("pre", "field " + cls, text));
  }
  function renderDetail(r) {
    body.textContent = "";
    add(body, el("h3", null, "Row " + r.r + " · attempt " + r.n));
    var status = add(body, el("div"));
    add(status, el("span", "pill o-" + r.outcome, words[r.outcome] || r.outcome));
    kv(body, [["reward", fmtReward(r.reward)], ["tokens", r.tokens], ["cost", fmtCost(r.cost)],
              ["duration", fmtMs(r.dur)], ["status", r.status]]);
    kv(body, [["rollout", r.rid]]);
    if (r.resumed) add(body, el("div", "muted", "carried forward from an earlier invocation"));
    renderInput(body, r);
    renderText(body, "Label", r.lab, "label");
    renderText(body, "Final answer", r.ans, "answer");
    renderText(body, "Grader's explanation", r.expl, "explanation");
    if (r.err || r.msg) {
      add(body, el("h4", null, "Error"));
      var err = add(body, el("div", "error"));
      add(err, el("div", null, (r.err || "error") + (r.msg ? ": " + r.msg : "")));
      if (r.tb) {
        var d = add(err, el("details"));
        add(d, el("summary", "muted", "traceback"));
        add(d, el("pre", null, r.tb));
      }
    }
    add(body, el("h4", null, "Trajectory"));
    var traj = add(body, el("div", "trajectory"));
    if (r.traj) {
      var t = r.traj;
      var f = t.final || {};
      kv(traj, [["label", t.label], ["steps", t.total_steps],
                ["prompt tokens", f.total_prompt_tokens],
                ["completion tokens", f.total_completion_tokens],
                ["agent", t.agent]]);
      if (t.sample_metrics) {
        kv(traj, Object.keys(t.sample_metrics).map(function (k) {
          return [k, t.sample_metrics[k]];
        }));
      }
      t.steps.forEach(function (s) { traj.appendChild(renderStep(s)); });
      if (t.total_steps > t.steps.length) {
        add(traj, el("div", "muted", (t.total_steps - t.steps.length) + " more steps in the file"));
      }
      if (r.traj_href) add(add(traj, el("div", "muted")), link(r.traj_href, "trajectory file"));
    } else if (r.traj_href) {
      var note = add(traj, el("div", "muted", "Not embedded (report size budget): "));
      add(note, link(r.traj_href, "open the trajectory file"));
    } else {
      add(traj, el("div", "muted", "No trajectory: the workflow produced no sample."));
    }
    add(body, el("h4", null, "Artifacts"));
    var arts = add(body, el("div", "artifacts"));
    if (!r.arts || !r.arts.length) add(arts, el("div", "muted", "None."));
    (r.arts || []).forEach(function (a) {
      if (a.more) { add(arts, el("div", "muted", a.name)); return; }
      if (typeof a.text === "string") {
        var box = add(arts, el("details", "artifact"));
        box.open = true;
        var s = add(box, el("summary"));
        add(s, link(a.href, a.name));
        add(s, el("span", "muted", "  " + fmtSize(a.size)));
        add(box, el("pre", null, a.text));
      } else {
        var line = add(arts, el("div", "artifact"));
        var inner = add(line, el("div", null));
        inner.style.padding = "4px 10px";
        add(inner, link(a.href, a.name));
        add(inner, el("span", "muted", "  " + fmtSize(a.size)));
      }
    });
  }
  var selected = null;
  function showDrawer(tr, wide) {
    drawer.classList.toggle("wide", wide);
    drawer.hidden = false;
    if (selected) selected.classList.remove("selected");
    selected = tr;
    if (selected) selected.classList.add("selected");
    drawer.scrollTop = 0;
  }
  function openKey(key) {
    var r = byKey[key];
    if (!r) return;
    renderDetail(r);
    showDrawer(tbody.querySelector('tr[data-key="' + key + '"]'), false);
  }
  function closeDetail() {
    drawer.hidden = true;
    if (selected) selected.classList.remove("selected");
    selected = null;
    if (location.hash) location.hash = "";
  }
  var cmp = data.cmp;
  var cmpByRow = {};
  var cmpBody = null;
  function attemptBox(parent, a, href) {
    var box = add(parent, el("div", "attempt"));
    var head = add(box, el("div", "step-head"));
    add(head, el("span", "pill o-" + a.outcome, words[a.outcome] || a.outcome));
    head.appendChild(document.createTextNode("  attempt " + a.n + " · reward " +
                                             fmtReward(a.reward) + " "));
    if (href) add(head, link(href, "open"));
    if (a.ans) add(box, el("pre", "msg answer", a.ans));
    if (a.err) add(box, el("div", "error", a.err + (a.msg ? ": " + a.msg : "")));
    if (a.expl) add(box, el("pre", "msg explanation", a.expl));
    if (!a.ans && !a.err) add(box, el("div", "muted", "no answer"));
  }
  function renderCompare(p) {
    body.textContent = "";
    add(body, el("h3", null, "Row " + p.r + " · both runs"));
    add(body, el("span", "pill c-" + p.change, p.change.replace("_", " in ")));
    renderInput(body, p);
    renderText(body, "Label", p.lab, "label");
    var grid = add(body, el("div", "sides"));
    [["b", "baseline: " + cmp.names[0]], ["a", "current: " + cmp.names[1]]].forEach(function (s) {
      var col = add(grid, el("div", "side side-" + s[0]));
      add(col, el("h4", null, s[1]));
      if (!p[s[0]].length) add(col, el("div", "muted", "not run"));
      p[s[0]].forEach(function (a) {
        attemptBox(col, a, s[0] === "a" ? "#row=" + p.r + "." + a.n : null);
      });
    });
  }
  function openCompare(row) {
    var p = cmpByRow[row];
    if (!p) return;
    renderCompare(p);
    showDrawer(cmpBody.querySelector('tr[data-cmp="' + row + '"]'), true);
  }
  // A click (or Enter) on a row of *body* routes through the URL (#<name>=<key>), so the
  // back button and a pasted link open the same view.
  function linkRows(body, name, open) {
    var attribute = name === "row" ? "data-key" : "data-" + name;
    body.addEventListener("click", function (event) {
      if (event.target.closest("a")) return;
      var tr = event.target.closest("tr");
      if (!tr) return;
      var key = tr.getAttribute(attribute);
      if (location.hash === "#" + name + "=" + key) open(key);
      else location.hash = name + "=" + key;
    });
    body.addEventListener("keydown", function (event) {
      if (event.key === "Enter" && event.target.tagName === "TR") event.target.click();
    });
  }
  if (cmp) {
    cmp.rows.forEach(function (p) { cmpByRow[String(p.r)] = p; });
    cmpBody = document.getElementById("row-by-row").tBodies[0];
    linkRows(cmpBody, "cmp", openCompare);
    var fChange = document.getElementById("f-change");
    fChange.addEventListener("change", function () {
      Array.prototype.forEach.call(cmpBody.rows, function (tr) {
        var change = tr.getAttribute("data-change");
        tr.hidden = fChange.value === "changed" &&
          change !== "regressed" && change !== "improved";
      });
    });
  }
  function route() {
    var m = /^#row=(\d+\.\d+)$/.exec(location.hash);
    if (m) openKey(m[1]);
    var c = /^#cmp=(\d+)$/.exec(location.hash);
    if (c && cmp) openCompare(c[1]);
  }
  linkRows(tbody, "row", openKey);
  document.getElementById("close").addEventListener("click", closeDetail);
  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape" && !drawer.hidden) closeDetail();
  });
  window.addEventListener("hashchange", route);
  applyFilters();
  route();
  document.body.setAttribute("data-ready", "1");
})();
"""
