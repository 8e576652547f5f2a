// The policy editor: a textarea over a highlighted copy of its text (our own small YAML
// highlighter), line numbers with error marks, and key completion from the policy's JSON Schema.
"use strict";

const YamlEditor = (() => {
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
  const span = (cls, s) => s ? `<span class="${cls}">${esc(s)}</span>` : "";

  // Where a comment starts: a '#' at the line start or after a space, outside quotes.
  function commentAt(line) {
    let q = null;
    for (let i = 0; i < line.length; i++) {
      const c = line[i];
      if (q) { if (c === q) q = null; continue; }
      if (c === '"' || c === "'") q = c;
      else if (c === "#" && (i === 0 || /\s/.test(line[i - 1]))) return i;
    }
    return -1;
  }

  const TOKEN = /("(?:[^"\\]|\\.)*"?|'(?:[^']|'')*'?)|([{}\[\],])|([A-Za-z_][\w.-]*)(\s*:)(?=\s|$)|(\b(?:true|false|null|yes|no)\b)|((?<![\w./:-])(?:[<>=!]=?\s*)?-?\d+(?:\.\d+)?(?:ms|s|m|h|d)?(?![\w./:-]))/g;

  function value(v) {
    let out = "", last = 0, m;
    TOKEN.lastIndex = 0;
    while ((m = TOKEN.exec(v))) {
      out += esc(v.slice(last, m.index));
      if (m[1]) out += span("s", m[1]);
      else if (m[2]) out += span("p", m[2]);
      else if (m[3]) out += span("k", m[3]) + span("p", m[4]);
      else if (m[5]) out += span("b", m[5]);
      else out += span("n", m[6]);
      last = TOKEN.lastIndex;
      if (m[0] === "") TOKEN.lastIndex++;
    }
    if (!out && v.trim()) {  // a plain scalar: a string to YAML
      const lead = v.match(/^\s*/)[0];
      return esc(lead) + span("s", v.slice(lead.length));
    }
    return out + esc(v.slice(last));
  }

  function line(l) {
    const ci = commentAt(l);
    const code = ci >= 0 ? l.slice(0, ci) : l;
    const comment = ci >= 0 ? l.slice(ci) : "";
    const m = code.match(/^(\s*)(-\s+|-$)?((?:"[^"]*"|'[^']*'|[^\s'"#{\[][^:#]*?))(\s*:)(\s.*|$)/);
    let out;
    if (m) out = esc(m[1]) + span("d", m[2] || "") + span("k", m[3]) + span("p", m[4]) + value(m[5]);
    else {
      const d = code.match(/^(\s*)(-)(\s.*|$)/);
      out = d ? esc(d[1]) + span("d", d[2]) + value(d[3]) : value(code);
    }
    return out + span("c", comment);
  }

  // --- schema ----------------------------------------------------------------------------

  function branches(schema, node) {
    const out = [];
    const walk = (n, depth) => {
      if (!n || depth > 8) return;
      if (n.$ref) return walk(schema.$defs?.[n.$ref.split("/").pop()], depth + 1);
      for (const k of ["anyOf", "oneOf", "allOf"]) if (n[k]) { n[k].forEach((b) => walk(b, depth + 1)); return; }
      out.push(n);
    };
    walk(node, 0);
    return out;
  }

  function child(schema, node, seg) {
    for (const b of branches(schema, node)) {
      if (seg === "[]") { if (b.items) return b.items; continue; }
      if (b.properties && seg in b.properties) return b.properties[seg];
    }
    for (const b of branches(schema, node)) {
      if (seg !== "[]" && b.additionalProperties && typeof b.additionalProperties === "object") return b.additionalProperties;
    }
    return null;
  }

  function describe(schema, node) {
    const bs = branches(schema, node);
    const desc = node.description || bs.map((b) => b.description).find(Boolean) || "";
    const en = bs.flatMap((b) => b.enum || (b.const !== undefined ? [b.const] : []));
    const types = [...new Set(bs.map((b) => b.type).filter(Boolean))];
    const def = node.default !== undefined ? ` (default ${JSON.stringify(node.default)})` : "";
    const what = en.length ? en.join(" | ") : types.join(" | ");
    return [what, desc].filter(Boolean).join(" — ") + def;
  }

  // The key path of the block that line `row` belongs to, for a key at column `indent`.
  // orEqual: a key at exactly that column owns the block too (a list written flush with its key).
  function pathAt(lines, row, indent, orEqual = false) {
    const path = [];
    let want = indent;
    for (let i = row - 1; i >= 0 && (want > 0 || orEqual); i--) {
      const l = lines[i];
      if (!l.trim() || l.trim().startsWith("#")) continue;
      const m = l.match(/^(\s*)(-\s+|-$)?(?:([^\s:#'"][^:#]*?)\s*:(?:\s|$))?/);
      const s = m[1].length, dash = m[2] ? m[2].length : 0, key = m[3];
      if (dash) {
        if (s < want && s + dash <= want) {  // inside this list item
          if (key && s + dash < want) path.unshift(key);
          path.unshift("[]");
          want = s; orEqual = true;
        }
        continue;
      }
      if (key && (s < want || (orEqual && s === want))) {
        path.unshift(key);
        want = s; orEqual = false;
      }
    }
    return path;
  }

  // The block path of a key line: [its parents..., "[]" when the line starts a list item].
  function blockPath(lines, row, spaces, dash) {
    return dash ? [...pathAt(lines, row, spaces, true), "[]"] : pathAt(lines, row, spaces);
  }

  return { line, esc, branches, child, describe, pathAt, blockPath };
})();

class PolicyEditor {
  constructor(textarea, pre, gutter, popup, hintEl) {
    this.ta = textarea; this.pre = pre; this.gutter = gutter; this.popup = popup; this.hintEl = hintEl;
    this.bad = new Map();  // line -> reason
    this.hints = null;  // {schema, predicates}
    this.items = []; this.sel = 0;
    this.onchange = () => {};
    this.ta.addEventListener("input", () => { this.render(); this.hint(); this.onchange(); });
    this.ta.addEventListener("scroll", () => this.sync());
    this.ta.addEventListener("keydown", (e) => this.key(e));
    this.ta.addEventListener("click", () => { this.close(); this.hint(); });
    this.ta.addEventListener("keyup", (e) => { if (e.key.startsWith("Arrow") && this.popup.hidden) this.hint(); });
    this.ta.addEventListener("blur", () => setTimeout(() => this.close(), 150));
  }

  get value() { return this.ta.value; }
  set value(v) { this.ta.value = v; this.render(); this.close(); }

  render() {
    const lines = this.ta.value.split("\n");
    this.pre.innerHTML = lines.map((l, i) => {
      const h = YamlEditor.line(l) || " ";
      return this.bad.has(i + 1) ? `<span class="errline">${h}</span>` : h;
    }).join("\n") + "\n";
    this.gutter.innerHTML = lines.map((_, i) => {
      const why = this.bad.get(i + 1);
      return why ? `<div class="bad" data-line="${i + 1}" title="${YamlEditor.esc(why)}">${i + 1}</div>` : `<div>${i + 1}</div>`;
    }).join("");
    this.sync();
  }

  sync() {
    this.pre.scrollTop = this.ta.scrollTop;
    this.pre.scrollLeft = this.ta.scrollLeft;
    this.gutter.scrollTop = this.ta.scrollTop;
  }

  setIssues(issues) {
    this.bad = new Map();
    for (const i of issues) if (i.line > 0 && !this.bad.has(i.line)) this.bad.set(i.line, i.reason);
    this.render();
  }

  goto(lineNo) {
    const lines = this.ta.value.split("\n");
    let pos = 0;
    for (let i = 0; i < Math.min(lineNo - 1, lines.length); i++) pos += lines[i].length + 1;
    this.ta.focus();
    this.ta.setSelectionRange(pos, pos + (lines[lineNo - 1] || "").length);
    this.ta.scrollTop = Math.max(0, (lineNo - 5) * 18);
  }

  // --- where the caret is -----------------------------------------------------------------

  caret() {
    const pos = this.ta.selectionStart;
    const before = this.ta.value.slice(0, pos);
    const lines = this.ta.value.split("\n");
    const row = before.split("\n").length - 1;
    const col = pos - (before.lastIndexOf("\n") + 1);
    return { pos, row, col, lines, line: lines[row] };
  }

  context() {
    const c = this.caret();
    const head = c.line.slice(0, c.col);
    const m = head.match(/^(\s*)(-\s+)?([\w.-]*)$/);
    if (!m) return null;
    const indent = m[1].length + (m[2] ? m[2].length : 0);
    const path = YamlEditor.blockPath(c.lines, c.row, m[1].length, !!m[2]);
    return { ...c, prefix: m[3], indent, path };
  }

  nodeAt(path) {
    if (!this.hints) return null;
    const schema = this.hints.schema;
    let node = schema;
    for (const seg of path) { node = node && YamlEditor.child(schema, node, seg); if (!node) return null; }
    return node;
  }

  suggestions(ctx) {
    if (!this.hints) return [];
    const last = ctx.path[ctx.path.length - 1];
    if (last === "when") return this.hints.predicates.map((k) => ({ key: k, doc: "rule predicate" }));
    const node = this.nodeAt(ctx.path);
    if (!node) return [];
    const schema = this.hints.schema;
    const present = new Set();
    // keys already written in this block (same indent, until the block ends)
    for (const dir of [-1, 1]) {
      for (let i = ctx.row + dir; i >= 0 && i < ctx.lines.length; i += dir) {
        const l = ctx.lines[i];
        if (!l.trim()) continue;
        const ind = l.match(/^\s*/)[0].length;
        const m = l.match(/^(\s*)(-\s+)?([\w.-]+)\s*:/);
        const keyInd = m ? m[1].length + (m[2] ? m[2].length : 0) : ind;
        if (keyInd < ctx.indent || (m && m[2] && keyInd === ctx.indent && dir === 1)) break;
        if (m && keyInd === ctx.indent) present.add(m[3]);
        if (m && m[2] && dir === -1 && keyInd === ctx.indent) break;
      }
    }
    const out = [];
    for (const b of YamlEditor.branches(schema, node)) {
      for (const [k, v] of Object.entries(b.properties || {})) {
        if (!present.has(k)) out.push({ key: k, doc: YamlEditor.describe(schema, v) });
      }
    }
    return out;
  }

  // --- completion popup -------------------------------------------------------------------

  key(e) {
    if (!this.popup.hidden) {
      if (e.key === "ArrowDown" || e.key === "ArrowUp") {
        e.preventDefault();
        this.sel = (this.sel + (e.key === "ArrowDown" ? 1 : -1) + this.items.length) % this.items.length;
        this.drawPopup();
        return;
      }
      if (e.key === "Enter" || e.key === "Tab") { e.preventDefault(); this.accept(this.items[this.sel]); return; }
      if (e.key === "Escape") { e.preventDefault(); this.close(); return; }
    }
    if (e.ctrlKey && (e.code === "Space" || e.key === " ")) { e.preventDefault(); this.open(); return; }
    if (e.key === "Tab") {  // indent with two spaces, as YAML wants
      e.preventDefault();
      this.ta.setRangeText("  ", this.ta.selectionStart, this.ta.selectionEnd, "end");
      this.ta.dispatchEvent(new Event("input"));
    }
  }

  open() {
    const ctx = this.context();
    if (!ctx) { this.hintEl.textContent = "completion: place the caret where a key goes"; return; }
    const all = this.suggestions(ctx);
    this.items = all.filter((s) => s.key.startsWith(ctx.prefix));
    if (!this.items.length) {
      this.hintEl.textContent = `no keys to suggest at ${ctx.path.join(".") || "the top level"}`;
      return;
    }
    this.ctx = ctx; this.sel = 0;
    this.popup.hidden = false;
    const top = (ctx.row + 1) * 18 + 6 - this.ta.scrollTop;
    this.popup.style.top = `${top}px`;
    this.popup.style.left = `${8 + ctx.col * this.charWidth() - this.ta.scrollLeft}px`;
    this.drawPopup();
  }

  drawPopup() {
    this.popup.innerHTML = this.items.map((s, i) =>
      `<li class="${i === this.sel ? "sel" : ""}" data-i="${i}" data-key="${YamlEditor.esc(s.key)}">${YamlEditor.esc(s.key)}<small>${YamlEditor.esc(s.doc.slice(0, 70))}</small></li>`
    ).join("");
    this.popup.querySelectorAll("li").forEach((li) =>
      li.addEventListener("mousedown", (ev) => { ev.preventDefault(); this.accept(this.items[+li.dataset.i]); }));
    const cur = this.popup.querySelector(".sel");
    if (cur) cur.scrollIntoView({ block: "nearest" });
    const s = this.items[this.sel];
    if (s) this.hintEl.textContent = `${s.key}: ${s.doc}`;
  }

  accept(s) {
    if (!s || !this.ctx) return;
    const end = this.ta.selectionStart;
    this.ta.setRangeText(`${s.key}: `, end - this.ctx.prefix.length, end, "end");
    this.close();
    this.ta.dispatchEvent(new Event("input"));
  }

  close() { this.popup.hidden = true; this.items = []; }

  charWidth() {
    if (!this._cw) {
      const probe = document.createElement("span");
      probe.textContent = "x".repeat(100);
      probe.style.cssText = "position:absolute;visibility:hidden;white-space:pre;font:inherit";
      this.pre.appendChild(probe);
      this._cw = probe.getBoundingClientRect().width / 100 || 7.8;
      probe.remove();
    }
    return this._cw;
  }

  // The schema's word on the key of the caret's line.
  hint() {
    if (!this.hints) return;
    const c = this.caret();
    const m = c.line.match(/^(\s*)(-\s+)?([\w.-]+)\s*:/);
    if (!m) { this.hintEl.textContent = "Ctrl+Space: keys from the policy schema"; return; }
    const path = YamlEditor.blockPath(c.lines, c.row, m[1].length, !!m[2]);
    const where = [...path, m[3]].join(".").replace(/\.\[\]/g, "[]");
    if (path[path.length - 1] === "when") {
      const known = this.hints.predicates.includes(m[3]) || m[3].startsWith("header.");
      this.hintEl.textContent = `${where}: ${known ? "rule predicate" : "unknown predicate"}`;
      return;
    }
    const parent = this.nodeAt(path);
    const node = parent && YamlEditor.child(this.hints.schema, parent, m[3]);
    this.hintEl.textContent = node ? `${where}: ${YamlEditor.describe(this.hints.schema, node)}` : `${where}`;
  }
}
