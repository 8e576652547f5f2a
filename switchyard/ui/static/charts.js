// Small SVG charts of our own: a multi-series line chart and horizontal share bars.
"use strict";

const Charts = (() => {
  const PALETTE = ["#2f6fde", "#e8590c", "#2b8a3e", "#ae3ec9", "#c92a2a", "#1098ad", "#f08c00", "#5c7cfa",
                   "#868e96", "#a9e34b"];
  const colors = new Map();  // a key keeps its color for the life of the page

  function color(key) {
    if (!colors.has(key)) colors.set(key, PALETTE[colors.size % PALETTE.length]);
    return colors.get(key);
  }

  function esc(s) {
    return String(s ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  }

  function niceMax(v) {
    if (v <= 0) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  // series: {key: [values...]} aligned with t (seconds since the epoch); spanS: seconds shown.
  function line(svg, t, series, spanS, legendEl) {
    const w = svg.clientWidth || 600, h = svg.clientHeight || 180;
    const L = 40, R = 8, T = 8, B = 20;
    const now = t.length ? t[t.length - 1] : Date.now() / 1000;
    const x = (ts) => L + (w - L - R) * (1 - (now - ts) / spanS);
    let max = 0;
    for (const vs of Object.values(series)) for (const v of vs) max = Math.max(max, v);
    const top = niceMax(max);
    const y = (v) => T + (h - T - B) * (1 - v / top);
    const parts = [];
    for (let i = 0; i <= 4; i++) {
      const v = top * i / 4, yy = y(v).toFixed(1);
      parts.push(`<line class="axis" x1="${L}" x2="${w - R}" y1="${yy}" y2="${yy}"/>`);
      parts.push(`<text x="${L - 4}" y="${yy}" text-anchor="end" dominant-baseline="middle">${+v.toFixed(2)}</text>`);
    }
    for (let m = 0; m <= spanS / 60; m++) {
      const xx = x(now - m * 60).toFixed(1);
      parts.push(`<text x="${xx}" y="${h - 4}" text-anchor="middle">${m ? "-" + m + "m" : "now"}</text>`);
    }
    const keys = Object.keys(series).sort();
    for (const k of keys) {
      const vs = series[k];
      const pts = [];
      for (let i = 0; i < vs.length; i++) {
        if (now - t[i] > spanS) continue;
        pts.push(`${x(t[i]).toFixed(1)},${y(vs[i]).toFixed(1)}`);
      }
      if (pts.length) {
        parts.push(`<polyline fill="none" stroke="${color(k)}" stroke-width="1.8" points="${pts.join(" ")}">` +
                   `<title>${esc(k)}</title></polyline>`);
      }
    }
    if (!keys.length) parts.push(`<text x="${w / 2}" y="${h / 2}" text-anchor="middle">no traffic yet</text>`);
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    svg.innerHTML = parts.join("");
    if (legendEl) {
      legendEl.innerHTML = keys.map((k) => {
        const vs = series[k];
        const last = vs.length ? vs[vs.length - 1] : 0;
        return `<span><span class="swatch" style="background:${color(k)}"></span>${esc(k)} ` +
               `<span class="muted">${last.toFixed(1)}/s</span></span>`;
      }).join("");
    }
  }

  // counts: {key: n}; draws one bar per key, largest first, with its count and share.
  function bars(el, counts, attr) {
    const entries = Object.entries(counts).filter(([, n]) => n > 0).sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1));
    const total = entries.reduce((s, [, n]) => s + n, 0);
    if (!total) { el.innerHTML = `<span class="muted">no requests in this window</span>`; return; }
    el.innerHTML = entries.map(([k, n]) => {
      const pct = 100 * n / total;
      return `<div class="bar" ${attr}="${esc(k)}" data-count="${Math.round(n)}" data-share="${pct.toFixed(1)}">` +
             `<span>${esc(k)}</span><span class="track"><span class="fill" style="display:block;width:${pct.toFixed(1)}%;` +
             `background:${color(k)}"></span></span><span class="val">${Math.round(n)} (${pct.toFixed(1)}%)</span></div>`;
    }).join("");
  }

  return { color, esc, line, bars };
})();
