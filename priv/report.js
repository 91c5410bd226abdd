(function () {
'use strict';
var NS = 'http://www.w3.org/2000/svg';
var body = document.body, rendered = 0, errors = 0;
function fail(e) {
  errors++;
  body.setAttribute('data-errors', String(errors));
  console.error('beamdiag chart failed: ' + (e && e.message ? e.message : e));
}
window.addEventListener('error', function () { errors++; body.setAttribute('data-errors', String(errors)); });
function el(tag, attrs, parent) {
  var e = document.createElementNS(NS, tag);
  for (var k in attrs) { if (Object.prototype.hasOwnProperty.call(attrs, k)) e.setAttribute(k, String(attrs[k])); }
  if (parent) parent.appendChild(e);
  return e;
}
function text(tag, attrs, s, parent) { var e = el(tag, attrs, parent); e.textContent = s; return e; }
function html(tag, cls, s, parent) {
  var e = document.createElement(tag);
  if (cls) e.className = cls;
  if (s !== undefined) e.textContent = s;
  if (parent) parent.appendChild(e);
  return e;
}
function pct(x) { return (100 * x).toFixed(1) + '%'; }
function fix(x, d) { return (typeof x === 'number' && isFinite(x)) ? x.toFixed(d) : '-'; }
var LAYERS = [];  /* [id, name] of each state of a ledger row, from the data */
var COLOURS = {run: '#2f6fde', spin: '#f0a020', blocked: '#d7302a', runq: '#8a5cd6', idle: '#e3e8ee'};
var W = 640, H = 220, M = {l: 46, r: 12, t: 10, b: 26};

function frame(container, title) {
  var box = html('div', 'chart', undefined, container);
  html('h4', '', title, box);
  var svg = el('svg', {viewBox: '0 0 ' + W + ' ' + H, role: 'img'}, box);
  text('title', {}, title, svg);
  return {box: box, svg: svg};
}
function xscale(ends) {
  var t1 = ends.length ? ends[ends.length - 1] : 1;
  return function (t) { return M.l + (W - M.l - M.r) * t / (t1 || 1); };
}
function axes(svg, ends, ymax, yfmt, x) {
  var ih = H - M.t - M.b;
  for (var i = 0; i <= 4; i++) {
    var v = ymax * i / 4, y = M.t + ih - ih * i / 4;
    el('line', {x1: M.l, x2: W - M.r, y1: y, y2: y, 'class': 'grid'}, svg);
    text('text', {x: M.l - 5, y: y + 4, 'text-anchor': 'end'}, yfmt(v), svg);
  }
  var t1 = ends.length ? ends[ends.length - 1] : 0;
  var step = Math.max(1, Math.ceil(t1 / 6));
  for (var s = 0; s <= t1 + 1e-9; s += step) {
    text('text', {x: x(s), y: H - 8, 'text-anchor': 'middle'}, s + ' s', svg);
  }
}
function stacked(container, title, ends, points) {
  var f = frame(container, title), svg = f.svg, x = xscale(ends);
  var ih = H - M.t - M.b;
  function y(v) { return M.t + ih - ih * Math.min(1, Math.max(0, v)); }
  axes(svg, ends, 1, function (v) { return Math.round(v * 100) + '%'; }, x);
  var lower = points.map(function () { return 0; });
  LAYERS.forEach(function (layer, li) {
    var upper = points.map(function (p, i) { return lower[i] + (p[li] || 0); });
    var d = '', i, t0;
    for (i = 0; i < points.length; i++) {
      t0 = i === 0 ? 0 : ends[i - 1];
      d += (i === 0 ? 'M' : 'L') + x(t0).toFixed(1) + ',' + y(upper[i]).toFixed(1) +
           'L' + x(ends[i]).toFixed(1) + ',' + y(upper[i]).toFixed(1);
    }
    for (i = points.length - 1; i >= 0; i--) {
      t0 = i === 0 ? 0 : ends[i - 1];
      d += 'L' + x(ends[i]).toFixed(1) + ',' + y(lower[i]).toFixed(1) +
           'L' + x(t0).toFixed(1) + ',' + y(lower[i]).toFixed(1);
    }
    if (points.length) el('path', {d: d + 'Z', fill: COLOURS[layer[0]], 'data-layer': layer[0]}, svg);
    lower = upper;
  });
  points.forEach(function (p, i) {
    var t0 = i === 0 ? 0 : ends[i - 1];
    var r = el('rect', {x: x(t0), y: M.t, width: Math.max(1, x(ends[i]) - x(t0)), height: ih, 'class': 'hover'}, svg);
    text('title', {}, t0.toFixed(1) + '-' + ends[i].toFixed(1) + ' s: ' +
         LAYERS.map(function (l, li) { return l[1] + ' ' + pct(p[li] || 0); }).join(', '), r);
  });
  rendered++;
}
function lines(container, title, ends, series, ymax, unit) {
  var f = frame(container, title), svg = f.svg, x = xscale(ends);
  var ih = H - M.t - M.b;
  function y(v) { return M.t + ih - ih * Math.min(1, Math.max(0, v / ymax)); }
  axes(svg, ends, ymax, function (v) { return String(+v.toFixed(2)); }, x);
  var legend = html('div', 'legend', undefined, f.box);
  series.forEach(function (s) {
    var d = '', started = false;
    s.values.forEach(function (v, i) {
      if (typeof v !== 'number') { started = false; return; }
      var t0 = i === 0 ? 0 : ends[i - 1];
      d += (started ? 'L' : 'M') + x(t0).toFixed(1) + ',' + y(v).toFixed(1) + 'L' + x(ends[i]).toFixed(1) + ',' + y(v).toFixed(1);
      started = true;
    });
    if (d) el('path', {d: d, fill: 'none', stroke: s.colour, 'stroke-width': 2, 'stroke-dasharray': s.dash || 'none'}, svg);
    var item = html('span', '', undefined, legend);
    var sw = html('i', 'sw', undefined, item);
    sw.style.background = s.colour;
    item.appendChild(document.createTextNode(s.name));
  });
  ends.forEach(function (t1, i) {
    var t0 = i === 0 ? 0 : ends[i - 1];
    var r = el('rect', {x: x(t0), y: M.t, width: Math.max(1, x(t1) - x(t0)), height: ih, 'class': 'hover'}, svg);
    text('title', {}, t0.toFixed(1) + '-' + t1.toFixed(1) + ' s: ' +
         series.map(function (s) { return s.name + ' ' + fix(s.values[i], 2) + ' ' + unit; }).join(', '), r);
  });
  rendered++;
}
var PALETTE = ['#2f6fde', '#f0a020', '#d7302a', '#8a5cd6', '#2e9e6a', '#e0609b', '#6b7b8c', '#17a2b8', '#a0522d', '#9acd32', '#4b0082', '#ff7f50'];
function bars(container, title, rows) {
  var states = [];
  rows.forEach(function (r) { Object.keys(r.shares).forEach(function (s) { if (states.indexOf(s) < 0) states.push(s); }); });
  states.sort(function (a, b) { return a === 'sleep' ? 1 : b === 'sleep' ? -1 : (a < b ? -1 : a > b ? 1 : 0); });
  var colour = {};
  states.forEach(function (s, i) { colour[s] = s === 'sleep' ? '#e3e8ee' : PALETTE[i % PALETTE.length]; });
  var bh = 22, h = M.t + rows.length * (bh + 8) + 24, lw = 110;
  var box = html('div', 'chart', undefined, container);
  html('h4', '', title, box);
  var svg = el('svg', {viewBox: '0 0 ' + W + ' ' + h, role: 'img'}, box);
  text('title', {}, title, svg);
  var iw = W - lw - M.r;
  rows.forEach(function (r, ri) {
    var y = M.t + ri * (bh + 8), x = lw;
    text('text', {x: lw - 6, y: y + bh / 2 + 4, 'text-anchor': 'end'}, r.type + ' (' + r.n + ')', svg);
    states.forEach(function (s) {
      var v = r.shares[s] || 0;
      if (v <= 0) return;
      var rect = el('rect', {x: x, y: y, width: Math.max(0.5, iw * v), height: bh, fill: colour[s]}, svg);
      text('title', {}, r.type + ': ' + s + ' ' + pct(v), rect);
      if (iw * v > 44) text('text', {x: x + 4, y: y + bh / 2 + 4, fill: s === 'sleep' ? '#59636e' : '#fff', style: 'fill:' + (s === 'sleep' ? '#59636e' : '#fff')}, s + ' ' + Math.round(v * 100) + '%', svg);
      x += iw * v;
    });
  });
  [0, 0.25, 0.5, 0.75, 1].forEach(function (v) {
    text('text', {x: lw + iw * v, y: h - 6, 'text-anchor': 'middle'}, Math.round(v * 100) + '%', svg);
  });
  var legend = html('div', 'legend', undefined, box);
  states.forEach(function (s) {
    var item = html('span', '', undefined, legend);
    var sw = html('i', 'sw', undefined, item);
    sw.style.background = colour[s];
    item.appendChild(document.createTextNode(s));
  });
  rendered++;
}
function spread(container, fig) {
  var title = fig.key + ' (' + fig.unit + ')';
  var f = frame(container, title), svg = f.svg, vals = fig.values || [];
  var share = fig.unit.indexOf('share') === 0;
  var fmtv = function (v) {
    if (share) return pct(v);
    if (v >= 1e6) return (v / 1e6).toFixed(1) + 'M';
    if (v >= 1e3) return (v / 1e3).toFixed(1) + 'k';
    return (+v.toFixed(2)).toString();
  };
  var ymax = vals.reduce(function (m, p) { return Math.max(m, p[1]); }, 0);
  ymax = share ? Math.min(1, Math.max(0.05, ymax * 1.1)) : Math.max(1e-9, ymax * 1.1);
  var ih = H - M.t - M.b, iw = W - M.l - M.r, bw = iw / Math.max(1, vals.length);
  function y(v) { return M.t + ih - ih * Math.min(1, Math.max(0, v / ymax)); }
  for (var i = 0; i <= 4; i++) {
    var gy = M.t + ih - ih * i / 4;
    el('line', {x1: M.l, x2: W - M.r, y1: gy, y2: gy, 'class': 'grid'}, svg);
    text('text', {x: M.l - 5, y: gy + 4, 'text-anchor': 'end'}, fmtv(ymax * i / 4), svg);
  }
  var odd = {}, labelled = 0;
  (fig.outliers || []).forEach(function (n) { odd[n] = true; });
  vals.forEach(function (p, i) {
    var x = M.l + i * bw, top = y(p[1]);
    var r = el('rect', {x: x, y: top, width: Math.max(0.5, bw - (bw > 3 ? 1 : 0)), height: Math.max(0.5, M.t + ih - top),
                        fill: odd[p[0]] ? '#d7302a' : '#8aa4c8', 'data-node': p[0], 'class': odd[p[0]] ? 'outlier' : 'node'}, svg);
    text('title', {}, p[0] + ': ' + fmtv(p[1]) + (odd[p[0]] ? ' (outlier)' : ''), r);
    if (odd[p[0]] && labelled < 3) {
      text('text', {x: Math.min(W - M.r - 4, x + bw + 3), y: Math.max(M.t + 10, top + 10 + 12 * labelled), 'class': 'label'}, p[0], svg);
      labelled++;
    }
  });
  var my = y(fig.median || 0);
  el('line', {x1: M.l, x2: W - M.r, y1: my, y2: my, stroke: '#2e9e6a', 'stroke-dasharray': '6 4', 'stroke-width': 1.5}, svg);
  text('text', {x: W - M.r, y: my - 4, 'text-anchor': 'end'}, 'median ' + fmtv(fig.median || 0), svg);
  text('text', {x: M.l + iw / 2, y: H - 8, 'text-anchor': 'middle'}, vals.length + ' nodes, sorted', svg);
  rendered++;
}
function run(name, f) { try { f(); } catch (e) { fail(name + ': ' + (e && e.message ? e.message : e)); } }
var node = document.getElementById('beamdiag-data');
var data = {};
run('data', function () { data = JSON.parse(node.textContent); });
if (data.kind === 'diagnosis') {
  LAYERS = data.states || [];
  var lc = document.getElementById('ledger-charts');
  if (lc) (data.ledger || []).forEach(function (s) {
    run('ledger ' + s.type, function () { stacked(lc, s.type + ' (' + s.n + ' threads)', data.t, s.points); });
  });
  var oc = document.getElementById('outlier-charts');
  if (oc) (data.outliers || []).forEach(function (o) {
    run('outlier', function () { stacked(oc, o.name + ' (' + o.type + ')', data.outlier_t, o.points); });
  });
  var cc = document.getElementById('cpu-charts');
  if (cc && data.cpu && data.t.length) run('cpu', function () {
    var c = data.cpu, avail = data.t.map(function () { return c.available; });
    var all = [].concat(c.node_cpus, c.sched_busy, c.host_busy || [], [c.available]).filter(function (v) { return typeof v === 'number'; });
    var ymax = Math.max(1, Math.ceil(Math.max.apply(null, all.concat([0])) * 1.1));
    if (ymax > 4) ymax = 4 * Math.ceil(ymax / 4);
    var series = [
      {name: 'node OS CPU', values: c.node_cpus, colour: '#2f6fde'},
      {name: 'scheduler busy (BEAM)', values: c.sched_busy, colour: '#d7302a'}
    ];
    if (c.host_busy && c.host_busy.length) series.push({name: 'host busy', values: c.host_busy, colour: '#6b7b8c', dash: '2 3'});
    series.push({name: 'CPUs available', values: avail, colour: '#2e9e6a', dash: '6 4'});
    lines(cc, 'CPUs per tick', data.t, series, ymax, 'CPUs');
  });
  var mc = document.getElementById('msacc-charts');
  if (mc && data.msacc && data.msacc.length) run('msacc', function () { bars(mc, 'msacc states by thread type', data.msacc); });
}
if (data.kind === 'cluster') {
  var kc = document.getElementById('cluster-charts');
  if (kc) (data.figures || []).forEach(function (fig) {
    run('figure ' + fig.key, function () { spread(kc, fig); });
  });
}
body.setAttribute('data-rendered', String(rendered));
}());
