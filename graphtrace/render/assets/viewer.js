/* graphtrace's trace explorer. Plain JS, no network. The trace is the JSON in #graphtrace-data (built by
   graphtrace/render/html.py); the tree is built lazily: a call's children become DOM nodes when it is expanded. */
(function () {
  'use strict';
  var D = JSON.parse(document.getElementById('graphtrace-data').textContent);
  var DIFF = D.kind === 'diff';
  var sides = D.sides;
  var pairs = D.pairs || [];
  var selected = null; // {side, k}

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function shapeText(t) { return '[' + t[1].join(', ') + '] ' + t[2]; }
  function num(x) {
    if (x === null || x === undefined) return '';
    if (typeof x === 'string') return x;
    if (x === 0) return '0';
    var a = Math.abs(x);
    return (a >= 1e4 || a < 1e-3) ? x.toExponential(3) : x.toPrecision(4).replace(/\.?0+$/, '');
  }
  function count(n) {  // 9280 -> "9.28K", as a parameter count reads at a glance
    if (n < 1e3) return String(n);
    var units = [[1e12, 'T'], [1e9, 'B'], [1e6, 'M'], [1e3, 'K']];
    for (var i = 0; i < units.length; i++) {
      if (n >= units[i][0]) return (n / units[i][0]).toPrecision(3).replace(/\.?0+$/, '') + units[i][1];
    }
    return String(n);
  }
  var WRAPPED = 'recorded by wrapping forward';
  function nonfinite(c) {
    var n = 0, list = c.out || [];
    for (var i = 0; i < list.length; i++) n += list[i][7] + list[i][8];
    return n;
  }
  function pairStatus(p) {
    if (!p) return '';
    if (p.status === 'diverged') return p.inputs_agree ? 'diverged' : 'downstream';
    if (!p.inputs_agree) return 'inputs';
    return p.status === 'equal' ? 'equal' : 'unchecked';
  }
  var STATUS_WORDS = {
    diverged: 'diverges while its inputs agree', downstream: 'diverges, and so do its inputs',
    inputs: 'inputs differ, outputs agree', equal: 'agrees within tolerance', unchecked: 'no output compared'
  };

  // -- index: parents, call ids of the drawn step, divergences inside --------------------------------------------
  sides.forEach(function (side, s) {
    side.rows = {};
    side.byId = {};
    var calls = side.calls;
    var g = side.steps[side.graph_step];
    if (g !== undefined) {
      var stack = [g];
      while (stack.length) {
        var k = stack.pop(), c = calls[k];
        side.byId[c.p + '@' + c.i] = k;
        if (c.c) for (var j = 0; j < c.c.length; j++) stack.push(c.c[j]);
      }
    }
    for (var i = calls.length - 1; i >= 0; i--) {
      var call = calls[i];
      var st = call.d !== undefined ? pairStatus(pairs[call.d]) : '';
      var mine = (st === 'diverged' || st === 'downstream' ? 1 : 0);
      call.bad = (call.bad || 0);
      if (call.u >= 0) calls[call.u].bad = (calls[call.u].bad || 0) + call.bad + mine;
    }
  });

  // -- layout -------------------------------------------------------------------------------------------------------
  var app = document.getElementById('app');
  var header = el('header');
  header.appendChild(el('h1', null, D.title));
  if (DIFF) {
    var nd = pairs.filter(function (p) { return p.status === 'diverged' || !p.inputs_agree; }).length;
    header.appendChild(el('span', 'verdict ' + (D.equal ? 'equal' : 'diverged'),
      D.equal ? 'equal within tolerance' : nd + ' matched calls diverge'));
    header.appendChild(el('span', 'meta', pairs.length + ' matched · ' + D.only[0] + ' only in A · ' + D.only[1] +
      ' only in B'));
  } else {
    var s0 = sides[0];
    var meta = el('span', 'meta', s0.calls.length + ' calls · ' + s0.steps.length + ' forward call' +
      (s0.steps.length === 1 ? '' : 's') + ' · captured with ' + s0.strategy + ' · ' + s0.coverage.split(';')[0]);
    meta.title = s0.coverage + '\nwhy: ' + s0.coverage_why;  // in words, then the technical reasons
    header.appendChild(meta);
    if (D.nonfinite !== undefined) {  // where NaN/Inf were made: the page opens there, the link goes back
      var bad = s0.calls[D.nonfinite];
      var link = el('a', 'nan-link', 'first NaN/Inf: ' + (bad.p.slice(bad.p.indexOf('.') + 1) || bad.p));
      link.href = '#';
      link.title = 'the first call whose output holds NaN or Inf while its inputs are finite';
      link.addEventListener('click', function (ev) { ev.preventDefault(); select(0, D.nonfinite, true); });
      header.appendChild(link);
    }
  }
  var search = el('div', 'search');
  var input = el('input');
  input.type = 'search';
  input.placeholder = 'search calls by path (e.g. layers.3.*attn)   /';
  input.title = 'a substring or a glob; ↑ ↓ walk the hits, Enter selects one. In the tree: ↑ ↓ move, → expands, ' +
    '← collapses';
  input.id = 'search';
  var results = el('div', 'results');
  results.hidden = true;
  search.appendChild(input);
  search.appendChild(results);
  header.appendChild(search);
  app.appendChild(header);

  var main = el('main', DIFF ? 'diff' : '');
  sides.forEach(function (side, s) {
    var pane = el('div', 'pane');
    var heading = el('h2', null, (DIFF ? (s === 0 ? 'A (reference) · ' : 'B · ') : '') + side.model +
      (side.label !== side.model ? ' — ' + side.label : ''));
    heading.title = side.label;
    pane.appendChild(heading);
    var tree = el('div', 'tree');
    tree.dataset.side = s;
    pane.appendChild(tree);
    side.tree = tree;
    side.pane = pane;
    main.appendChild(pane);
  });
  var right = el('div', 'right');
  var graph = el('div', 'graph');
  graph.id = 'graph';
  var details = el('div', 'details');
  details.id = 'details';
  right.appendChild(graph);
  right.appendChild(details);
  main.appendChild(right);
  app.appendChild(main);

  // -- the tree -------------------------------------------------------------------------------------------------
  function rowFor(s, k, depth) {
    var side = sides[s], c = side.calls[k];
    var row = el('div', 'row');
    row.style.setProperty('--depth', depth);
    row.dataset.side = s;
    row.dataset.k = k;
    row.appendChild(el('span', 'tog', c.c ? '▸' : ''));
    var label = c.u < 0 ? c.p : c.n;
    if (c.i) label += ' #' + (c.i + 1);
    row.appendChild(el('span', 'name', label));
    if (c.t && c.t !== c.n) row.appendChild(el('span', 'type', c.t));
    if (c.out && c.out.length && !DIFF) {  // a diff's rows leave shapes to the A | B | Δ table: the panes are narrow
      row.appendChild(el('span', 'shape', shapeText(c.out[0]) + (c.out.length > 1 ? ' +' + (c.out.length - 1) : '')));
    }
    row.title = c.p + (c.t ? ' (' + c.t + ')' : '');  // in full, when the row is narrower than its text
    if (c.k === 'op') row.appendChild(el('span', 'badge op', 'op'));
    var bad = nonfinite(c);
    if (bad) row.appendChild(el('span', 'badge nan', 'NaN/Inf ' + bad));
    if (c.w && !DIFF) row.appendChild(el('span', 'params', count(c.w) + ' params'));
    if (c.e) row.appendChild(el('span', 'badge err', 'raised'));
    if (c.h) row.appendChild(el('span', 'badge hook', 'hooks')).title = c.h.join('\n');
    if (c.f) row.appendChild(el('span', 'badge wrap', 'wrapped')).title = WRAPPED + ': ' + c.fw;
    if (c.d !== undefined) {
      var st = pairStatus(pairs[c.d]);
      row.classList.add('st-' + st);
      if (c.d === D.first) row.classList.add('first');
    }
    if (c.x) { row.classList.add('st-only'); row.appendChild(el('span', 'badge only', 'only in ' + (s ? 'B' : 'A'))); }
    if (c.bad) row.appendChild(el('span', 'badge inside', c.bad + ' diverging inside'));
    side.rows[k] = row;
    var wrap = el('div', 'node');
    wrap.appendChild(row);
    return wrap;
  }

  function foldRow(s, parentK, run, depth) {
    var c = sides[s].calls[parentK];
    var first = sides[s].calls[c.c[run[0]]], last = sides[s].calls[c.c[run[1] - 1]];
    var row = el('div', 'row fold');
    row.style.setProperty('--depth', depth);
    row.appendChild(el('span', 'tog', '▸'));
    var tail = last.p.slice(last.p.lastIndexOf('.') + 1);
    var name = first.p === last.p ? first.n + ' #' + (first.i + 1) + '–' + (last.i + 1) : first.n + '–' + tail;
    row.appendChild(el('span', 'name', name));
    row.appendChild(el('span', 'type', (first.t ? first.t + ' ' : '') + '×' + (run[1] - run[0]) + ' identical blocks' +
      (DIFF ? ', all agree' : '')));
    if (first.out && first.out.length && !DIFF) row.appendChild(el('span', 'shape', shapeText(first.out[0])));
    var bad = 0;
    for (var i = run[0]; i < run[1]; i++) {
      var m = sides[s].calls[c.c[i]];
      bad += (m.bad || 0) + (m.d !== undefined && /diverged|downstream/.test(pairStatus(pairs[m.d])) ? 1 : 0);
    }
    if (bad) row.appendChild(el('span', 'badge inside', bad + ' diverging inside'));
    var wrap = el('div', 'node');
    wrap.appendChild(row);
    row.addEventListener('click', function () { toggle(wrap, row); });
    wrap.fill = function () {
      var kids = el('div', 'kids');
      for (var i = run[0]; i < run[1]; i++) kids.appendChild(rowFor(s, c.c[i], depth + 1));
      return kids;
    };
    return wrap;
  }

  function childrenOf(s, k, depth) {
    var c = sides[s].calls[k];
    var kids = el('div', 'kids');
    var runs = c.r || [], r = 0;
    for (var i = 0; i < c.c.length; i++) {
      if (r < runs.length && runs[r][0] === i) {
        var fold = foldRow(s, k, runs[r], depth + 1);
        fold.dataset.start = runs[r][0];
        fold.dataset.stop = runs[r][1];
        kids.appendChild(fold);
        i = runs[r][1] - 1;
        r++;
      } else {
        kids.appendChild(rowFor(s, c.c[i], depth + 1));
      }
    }
    return kids;
  }

  function toggle(wrap, row, open) {
    var kids = wrap.querySelector(':scope > .kids');
    var isOpen = kids && !kids.hidden;
    if (open === undefined) open = !isOpen;
    if (open === isOpen) return;
    if (!kids) {
      if (wrap.fill) kids = wrap.fill();
      else kids = childrenOf(+row.dataset.side, +row.dataset.k, +row.style.getPropertyValue('--depth'));
      wrap.appendChild(kids);
    }
    kids.hidden = !open;
    row.querySelector('.tog').textContent = open ? '▾' : '▸';
  }

  function treeClick(ev) {
    var row = ev.target.closest('.row');
    if (!row || row.classList.contains('fold')) return;
    var s = +row.dataset.side, k = +row.dataset.k;
    if (ev.target.classList.contains('tog') || (selected && selected.side === s && selected.k === k)) {
      if (sides[s].calls[k].c) toggle(row.parentNode, row);
      if (ev.target.classList.contains('tog')) return;
    }
    select(s, k, true);
  }
  sides.forEach(function (side) { side.tree.addEventListener('click', treeClick); });

  /* Make the row of call k exist and be visible: expand its ancestors (and the folded run holding it). */
  function reveal(s, k) {
    var side = sides[s], chain = [], c = k;
    while (side.calls[c].u >= 0) { chain.push(c); c = side.calls[c].u; }
    chain.reverse();
    var parent = c;
    for (var i = 0; i < chain.length; i++) {
      var prow = side.rows[parent];
      toggle(prow.parentNode, prow, true);
      var child = chain[i];
      if (!side.rows[child]) { // inside a folded run of parent
        var pos = side.calls[parent].c.indexOf(child);
        var folds = prow.parentNode.querySelectorAll(':scope > .kids > .node');
        for (var j = 0; j < folds.length; j++) {
          var f = folds[j];
          if (f.fill && +f.dataset.start <= pos && pos < +f.dataset.stop) toggle(f, f.firstChild, true);
        }
      } else {
        var fw = side.rows[child].parentNode.parentNode.parentNode; // row -> node -> kids -> fold node?
        if (fw && fw.fill) toggle(fw, fw.firstChild, true);
      }
      parent = child;
    }
    return side.rows[k];
  }

  // -- the graph ----------------------------------------------------------------------------------------------------
  var graphSide = 0, scale = null;
  var tools = el('div', 'tools');
  graph.appendChild(tools);
  var holders = document.getElementById('graphs');
  var svgs = [];
  sides.forEach(function (side, s) {
    var holder = holders.querySelector('.svg-holder[data-side="' + s + '"]');
    if (holder) {
      holder.hidden = s !== 0;
      graph.appendChild(holder);
      svgs[s] = holder.querySelector('svg');
      side.boxes = {};
      holder.querySelectorAll('g.node, g.cluster').forEach(function (g) {
        var title = g.querySelector('title');
        if (!title) return;
        var id = title.textContent.replace(/^cluster_/, '');
        var k = side.byId[id];
        if (k === undefined) return;
        g.dataset.k = k;
        side.boxes[k] = g;
        if (DIFF) {
          var st = boxStatus(side, k);
          if (st) g.classList.add((g.classList.contains('cluster') ? 'cl-' : 'st-') + st);
        }
      });
      holder.addEventListener('click', function (ev) {
        var g = ev.target.closest('g.node, g.cluster');
        if (!g || g.dataset.k === undefined) return;
        ev.preventDefault();
        select(s, +g.dataset.k, true);
      });
    } else {
      var note = el('div', 'note', 'No call graph: ' + (side.graph_note || 'not drawn.'));
      note.dataset.side = s;
      note.hidden = s !== 0;
      graph.appendChild(note);
    }
  });
  /* The calls a box stands for: a folded run of identical blocks is drawn as its first. */
  function members(side, k) {
    var c = side.calls[k];
    if (c.u < 0) return [k];
    var p = side.calls[c.u], pos = p.c.indexOf(k);
    var runs = p.r || [];
    for (var i = 0; i < runs.length; i++) {
      if (runs[i][0] === pos) return p.c.slice(runs[i][0], runs[i][1]);
    }
    return [k];
  }
  /* The calls at k's place in every block of the folded run around it (k alone when none is). */
  function equivalents(side, k) {
    var a = k;
    while (a >= 0) {
      var run = members(side, a);
      if (run.length > 1) {
        var rel = side.calls[k].p.slice(side.calls[a].p.length), out = [];
        run.forEach(function (m) {
          var found = side.byId[side.calls[m].p + rel + '@' + side.calls[k].i];
          if (found !== undefined) out.push(found);
        });
        return out.length ? out : [k];
      }
      a = side.calls[a].u;
    }
    return [k];
  }
  /* How a box compares: the worst of the calls it stands for, and of the calls inside them. */
  function boxStatus(side, k) {
    var list = [], own = [], inside = 0;
    members(side, k).forEach(function (m) { list = list.concat(equivalents(side, m)); });
    list.forEach(function (m) {
      var c = side.calls[m];
      if (c.d !== undefined) own.push(pairStatus(pairs[c.d]));
      inside += c.bad || 0;
    });
    if (own.indexOf('diverged') >= 0) return 'diverged';
    if (own.indexOf('downstream') >= 0) return 'downstream';
    if (inside) return 'inside';
    if (own.length && own.every(function (s) { return s === 'equal'; })) return 'equal';
    return '';
  }
  /* The call drawn for k: k itself, or the call at the same place in the first block of a folded run. */
  function drawnCall(side, k) {
    var a = k;
    while (a >= 0) {
      if (side.boxes[a]) return a;
      var c = side.calls[a];
      if (c.u < 0) break;
      var p = side.calls[c.u], pos = p.c.indexOf(a), runs = p.r || [];
      for (var i = 0; i < runs.length; i++) {
        if (runs[i][0] < pos && pos < runs[i][1]) {
          var head = side.calls[p.c[runs[i][0]]], target = side.calls[k];
          var id = head.p + target.p.slice(c.p.length) + '@' + target.i;
          var mapped = side.byId[id];
          if (mapped !== undefined) return drawnCall(side, mapped);
        }
      }
      a = c.u;
    }
    return -1;
  }
  function button(text, fn, cls) {
    var b = el('button', cls || '', text);
    b.addEventListener('click', fn);
    tools.appendChild(b);
    return b;
  }
  var sideButtons = [];
  if (DIFF) {
    sideButtons = [button('graph A', function () { showGraph(0); }, 'on'), button('graph B', function () { showGraph(1); })];
  }
  button('fit', function () { zoom(null); });
  button('−', function () { zoom((scale || fitScale()) / 1.25); });
  button('+', function () { zoom((scale || fitScale()) * 1.25); });
  button('1:1', function () { zoom(1); });
  tools.appendChild(el('span', 'hint', 'click a box to select its call'));
  function showGraph(s) {
    graphSide = s;
    graph.querySelectorAll('.svg-holder, .note').forEach(function (h) { h.hidden = +h.dataset.side !== s; });
    sideButtons.forEach(function (b, i) { b.classList.toggle('on', i === s); });
    zoom(scale);
  }
  function natural(svg) {
    var vb = svg.viewBox && svg.viewBox.baseVal;
    return vb && vb.width ? [vb.width, vb.height] : [svg.width.baseVal.value, svg.height.baseVal.value];
  }
  function fitScale() {
    var svg = svgs[graphSide];
    if (!svg) return 1;
    var n = natural(svg);
    return Math.min(1.2, Math.max(0.05, (graph.clientWidth - 16) / n[0]));
  }
  function zoom(value) {
    scale = value;
    var svg = svgs[graphSide];
    if (!svg) return;
    var f = value || fitScale(), n = natural(svg);
    svg.setAttribute('width', Math.round(n[0] * f) + 'px');  // the viewBox is in points: 1:1 shows 1 pt as 1 px
    svg.setAttribute('height', Math.round(n[1] * f) + 'px');
  }
  window.addEventListener('resize', function () { if (!scale) zoom(null); });

  function markBox(s, k) {
    graph.querySelectorAll('g.selected').forEach(function (g) { g.classList.remove('selected'); });
    var side = sides[s];
    if (!side.boxes || k < 0) return null;
    var c = drawnCall(side, k);
    if (c < 0) return null;
    var g = side.boxes[c];
    g.classList.add('selected');
    return g;
  }

  // -- the details --------------------------------------------------------------------------------------------------
  function tensorTable(title, list) {
    var frag = document.createDocumentFragment();
    if (!list || !list.length) return frag;
    frag.appendChild(el('h4', null, title));
    var t = el('table', 't');
    var head = el('tr');
    ['name', 'shape', 'dtype', 'mean', 'std', 'min', 'max', 'NaN', 'Inf'].forEach(function (h) {
      head.appendChild(el('th', null, h));
    });
    t.appendChild(head);
    list.forEach(function (x) {
      var tr = el('tr', x[7] || x[8] ? 'bad' : '');
      tr.appendChild(el('td', null, x[0]));
      tr.appendChild(el('td', null, '[' + x[1].join(', ') + ']' + (x[9] ? ' (' + x[9] + ')' : '')));
      tr.appendChild(el('td', null, x[2]));
      for (var i = 3; i < 7; i++) tr.appendChild(el('td', 'num', num(x[i])));
      tr.appendChild(el('td', 'num', String(x[7])));
      tr.appendChild(el('td', 'num', String(x[8])));
      t.appendChild(tr);
    });
    frag.appendChild(t);
    return frag;
  }

  function callDetails(s, k, into) {
    var side = sides[s], c = side.calls[k];
    into.appendChild(el('h3', null, c.p + (c.i ? ' #' + (c.i + 1) : '')));
    var sub = [c.t || '', c.k === 'op' ? 'op' : 'module', 'captured by ' + (c.s || 'eager'), 'call ' + c.p + '@' + c.i];
    if (c.c) sub.push(c.c.length + ' calls directly inside');
    if (c.w) sub.push(c.w.toLocaleString('en-US') + ' parameters');
    into.appendChild(el('div', 'sub', sub.filter(Boolean).join(' · ')));
    if (c.e) into.appendChild(el('div', 'banner bad', 'raised ' + c.e));
    if (c.h) {
      into.appendChild(el('div', 'banner info', 'hooks run around it (' + c.h.join(', ') +
        '): recorded as its caller sees it, hooks applied'));
    }
    if (c.f) {  // a note, not a fault: the technical reason one click away
      var note = el('div', 'banner info wrapped', WRAPPED + ': ' + c.fw + ' ');
      var why = el('details', 'why');
      why.appendChild(el('summary', null, 'why'));
      why.appendChild(el('code', null, c.f));
      note.appendChild(why);
      into.appendChild(note);
    }
    var bad = nonfinite(c);
    if (bad) into.appendChild(el('div', 'banner bad', bad + ' non-finite values in the outputs'));
    into.appendChild(tensorTable('inputs', c.in));
    into.appendChild(tensorTable('outputs', c.out));
    if (c.v) {
      into.appendChild(el('h4', null, 'other arguments'));
      var t = el('table', 't');
      c.v.forEach(function (v) {
        var tr = el('tr');
        tr.appendChild(el('td', null, v[0]));
        tr.appendChild(el('td', null, v[1]));
        t.appendChild(tr);
      });
      into.appendChild(t);
    }
    var ops = (c.c || []).filter(function (j) { return side.calls[j].k === 'op'; });
    if (ops.length) {
      into.appendChild(el('h4', null, 'op records (' + ops.length + ')'));
      var ot = el('table', 't');
      var head = el('tr');
      ['op', 'output', 'mean', 'std', 'NaN/Inf'].forEach(function (h) { head.appendChild(el('th', null, h)); });
      ot.appendChild(head);
      ops.forEach(function (j) {
        var o = side.calls[j], out = (o.out || [])[0];
        var tr = el('tr', 'link' + (nonfinite(o) ? ' bad' : ''));
        tr.appendChild(el('td', null, o.n));
        tr.appendChild(el('td', null, out ? shapeText(out) : ''));
        tr.appendChild(el('td', 'num', out ? num(out[3]) : ''));
        tr.appendChild(el('td', 'num', out ? num(out[4]) : ''));
        tr.appendChild(el('td', 'num', String(nonfinite(o))));
        tr.addEventListener('click', function () { select(s, j, true); });
        ot.appendChild(tr);
      });
      into.appendChild(ot);
    }
  }

  /* a and b printed with as many significant digits as it takes to tell them apart (4 at least, 17 at most). */
  function apart(a, b) {
    if (typeof a !== 'number' || typeof b !== 'number') return [num(a), num(b)];
    for (var p = 4; p <= 17; p++) {
      var sa = digits(a, p), sb = digits(b, p);
      if (sa !== sb || a === b || p === 17) return [sa, sb];
    }
  }
  function digits(x, p) {
    var m = Math.abs(x);
    return x === 0 ? '0' : (m >= 1e4 || m < 1e-3) ? x.toExponential(p - 1) : x.toPrecision(p);
  }
  function delta(a, b) {
    if (typeof a !== 'number' || typeof b !== 'number') return '';
    var d = b - a;
    return d === 0 ? '0' : (d > 0 ? '+' : '') + d.toExponential(2);
  }
  var STATS = ['mean', 'std', 'min', 'max'];

  /* One table: each compared tensor's statistics in A and B and their difference, the measures of its values. */
  function pairDetails(p, into) {
    var st = pairStatus(p);
    var cls = st === 'diverged' || st === 'downstream' ? 'bad' : st === 'inputs' ? 'warn' : st === 'equal' ? 'ok' : 'info';
    var text = (p === pairs[D.first] ? 'FIRST DIVERGENCE — ' : '') + STATUS_WORDS[st] + (p.reason ? ': ' + p.reason : '');
    into.appendChild(el('div', 'banner ' + cls, text));
    var diffs = (p.inputs || []).concat(p.outputs || []);
    if (!diffs.length) return;
    into.appendChild(el('h4', null, 'A | B | Δ — tensors compared (matched by ' + p.how + ')'));
    var t = el('table', 't abd');
    var head = el('tr');
    ['tensor', '', 'A', 'B', 'Δ = B − A'].forEach(function (h) { head.appendChild(el('th', null, h)); });
    t.appendChild(head);
    diffs.forEach(function (d) {
      var shape = '[' + d.shape_a.join(', ') + ']';
      if (d.shape_b.join() !== d.shape_a.join()) shape += ' vs [' + d.shape_b.join(', ') + ']';
      var name = d.name_a === d.name_b ? d.name_a : d.name_a + ' ↔ ' + d.name_b;
      var rows = d.sa ? STATS.length : 0, measured = d.basis === 'values';
      var first = el('tr', 'tensor ' + (d.status === 'diverged' ? 'bad' : ''));
      var label = el('td', 'tensor-name');
      label.rowSpan = rows + (measured ? 1 : 0) || 1;
      label.appendChild(el('div', null, name));
      label.appendChild(el('div', 'sub', shape + ' · ' + d.status));
      first.appendChild(label);
      var tr = first;
      if (!rows && !measured) {
        var none = el('td', 'note', d.reason || 'nothing to compare');
        none.colSpan = 4;
        tr.appendChild(none);
        t.appendChild(tr);
      }
      for (var i = 0; i < rows; i++) {
        if (i) tr = el('tr', d.status === 'diverged' ? 'bad' : '');
        var shown = apart(d.sa[i], d.sb[i]);
        tr.appendChild(el('td', 'stat', STATS[i]));
        tr.appendChild(el('td', 'num', shown[0]));
        tr.appendChild(el('td', 'num', shown[1]));
        tr.appendChild(el('td', 'num delta', delta(d.sa[i], d.sb[i])));
        t.appendChild(tr);
      }
      if (measured) {
        if (rows) tr = el('tr', d.status === 'diverged' ? 'bad' : '');
        var parts = ['max |Δ| ' + num(d.max_abs), 'max rel ' + num(d.max_rel), 'cosine ' + num(d.cosine)];
        if (d.outside !== null && d.outside !== undefined) parts.push(d.outside + ' of ' + d.numel + ' outside');
        tr.appendChild(el('td', 'stat', 'values'));
        var cell = el('td', 'measures', parts.join(' · '));
        cell.colSpan = 3;
        tr.appendChild(cell);
        t.appendChild(tr);
      }
    });
    into.appendChild(t);
    diffs.forEach(function (d) {  // why, in words, under the table: it wraps, no column to clip it
      if (d.reason) into.appendChild(el('p', 'why', d.name_a + ': ' + d.reason));
    });
  }

  function select(s, k, follow) {
    var side = sides[s];
    document.querySelectorAll('.row.selected').forEach(function (r) { r.classList.remove('selected'); });
    var row = reveal(s, k);
    row.classList.add('selected');
    row.scrollIntoView({ block: 'nearest' });
    selected = { side: s, k: k };
    var c = side.calls[k];
    details.textContent = '';
    if (DIFF) {
      var other = 1 - s;
      if (c.d !== undefined) {
        var p = pairs[c.d];
        var ok = s === 0 ? p.kb : p.ka;
        var orow = reveal(other, ok);
        orow.classList.add('selected');
        orow.scrollIntoView({ block: 'nearest' });
        pairDetails(p, details);
        [0, 1].forEach(function (which) {
          var part = el('div', 'side-details');
          part.appendChild(el('div', 'side-tag', which === 0 ? 'A (reference)' : 'B'));
          callDetails(which, which === s ? k : ok, part);
          details.appendChild(part);
        });
      } else {
        if (c.x) details.appendChild(el('div', 'banner info', 'only in ' + (s ? 'B' : 'A') + ': no counterpart in the other trace'));
        callDetails(s, k, details);
      }
    } else {
      callDetails(s, k, details);
    }
    if (follow && DIFF && graphSide !== s && side.boxes) showGraph(s);
    var g = markBox(graphSide, graphSide === s ? k : (c.d !== undefined ? (s === 0 ? pairs[c.d].kb : pairs[c.d].ka) : -1));
    if (g && follow) {
      var gr = g.getBoundingClientRect(), pr = graph.getBoundingClientRect();
      if (gr.bottom < pr.top || gr.top > pr.bottom || gr.right < pr.left || gr.left > pr.right) {
        graph.scrollTop += gr.top - pr.top - pr.height / 2;
        graph.scrollLeft += gr.left - pr.left - pr.width / 2;
      }
    }
    document.documentElement.dataset.selected = s + ':' + k;
  }

  // -- search -------------------------------------------------------------------------------------------------------
  var timer = null, hits = [], active = 0;
  function matcher(q) {
    q = q.trim().toLowerCase();
    if (!q) return null;
    if (q.indexOf('*') < 0 && q.indexOf('?') < 0) return function (p) { return p.toLowerCase().indexOf(q) >= 0; };
    var re = new RegExp(q.replace(/[.+^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '.*').replace(/\?/g, '.'));
    return function (p) { return re.test(p.toLowerCase()); };
  }
  function runSearch() {
    var match = matcher(input.value);
    results.textContent = '';
    hits = [];
    if (!match) { results.hidden = true; return; }
    var total = 0;
    sides.forEach(function (side, s) {
      side.calls.forEach(function (c, k) {
        if (match(c.p)) {
          total++;
          if (hits.length < 200) hits.push([s, k]);
        }
      });
    });
    results.appendChild(el('div', 'count', total + ' calls' + (total > hits.length ? ', first ' + hits.length + ' shown' : '')));
    hits.forEach(function (h, i) {
      var c = sides[h[0]].calls[h[1]];
      var d = el('div', 'hit', (DIFF ? (h[0] ? 'B ' : 'A ') : '') + c.p + (c.i ? ' #' + (c.i + 1) : ''));
      d.addEventListener('mousedown', function (ev) { ev.preventDefault(); pick(i); });
      results.appendChild(d);
    });
    results.hidden = false;
    activate(0);
  }
  /* The hit Enter picks: ↑ and ↓ in the search box walk the hits. */
  function activate(i) {
    var rows = results.querySelectorAll('.hit');
    if (!rows.length) return;
    active = Math.max(0, Math.min(rows.length - 1, i));
    rows.forEach(function (r, j) { r.classList.toggle('active', j === active); });
    rows[active].scrollIntoView({ block: 'nearest' });
  }
  function pick(i) {
    var h = hits[i];
    if (!h) return;
    results.hidden = true;
    select(h[0], h[1], true);
  }
  input.addEventListener('input', function () {
    clearTimeout(timer);
    timer = setTimeout(function () { timer = null; runSearch(); }, 120);
  });
  input.addEventListener('keydown', function (ev) {
    var fresh = timer !== null || results.hidden;  // typed since the hits were listed (or they were closed)
    if (ev.key === 'Enter') {
      if (fresh) { clearTimeout(timer); timer = null; runSearch(); }
      pick(active);
    } else if (ev.key === 'ArrowDown' || ev.key === 'ArrowUp') {
      if (fresh) { clearTimeout(timer); timer = null; runSearch(); }
      else activate(active + (ev.key === 'ArrowDown' ? 1 : -1));
      ev.preventDefault();
    } else if (ev.key === 'Escape') {
      results.hidden = true;
    }
  });
  input.addEventListener('blur', function () { results.hidden = true; });

  // -- keyboard: arrows move through the visible rows of the selected call's tree ---------------------------------
  function visibleRows(s) {
    return Array.prototype.filter.call(sides[s].tree.querySelectorAll('.row:not(.fold)'), function (r) {
      return r.offsetParent !== null;
    });
  }
  document.addEventListener('keydown', function (ev) {
    if (!selected || ev.target === input || ev.altKey || ev.ctrlKey || ev.metaKey) return;
    var s = selected.side, k = selected.k, row = sides[s].rows[k], c = sides[s].calls[k];
    if (ev.key === 'ArrowDown' || ev.key === 'ArrowUp') {
      var rows = visibleRows(s), at = rows.indexOf(row) + (ev.key === 'ArrowDown' ? 1 : -1);
      if (at >= 0 && at < rows.length) select(s, +rows[at].dataset.k, true);
    } else if (ev.key === 'ArrowRight' && c.c) {
      toggle(row.parentNode, row, true);
    } else if (ev.key === 'ArrowLeft') {
      var kids = row.parentNode.querySelector(':scope > .kids');
      if (kids && !kids.hidden) toggle(row.parentNode, row, false);
      else if (c.u >= 0) select(s, c.u, true);
    } else if (ev.key === '/') {
      input.focus();
    } else {
      return;
    }
    ev.preventDefault();
  });

  // -- start ------------------------------------------------------------------------------------------------------
  sides.forEach(function (side, s) {
    side.steps.forEach(function (k, number) {
      var wrap = rowFor(s, k, 0);
      if (side.steps.length > 1) {
        var label = wrap.querySelector('.name');
        label.textContent = 'step ' + number + (side.phases[number] ? ' (' + side.phases[number] + ')' : '') + ': ' + label.textContent;
      }
      side.tree.appendChild(wrap);
    });
    if (!side.steps.length) side.tree.appendChild(el('div', 'empty', 'this trace recorded no forward call'));
    var last = side.steps[side.steps.length - 1];
    if (last !== undefined) {
      var row = side.rows[last];
      toggle(row.parentNode, row, true);
      (side.calls[last].c || []).forEach(function (k) {
        var r = side.rows[k];
        if (r && side.calls[k].c) toggle(r.parentNode, r, true);
      });
    }
  });
  zoom(null);
  if (DIFF && D.first !== null && D.first !== undefined) {
    select(0, pairs[D.first].ka, true);
  } else if (D.nonfinite !== undefined) {
    select(0, D.nonfinite, true);
  } else if (sides[0].steps.length) {
    select(0, sides[0].steps[sides[0].steps.length - 1], false);
  }
  window.graphtrace = { select: select, reveal: reveal, data: D, toggle: function (s, k, open) {
    var row = reveal(s, k); toggle(row.parentNode, row, open);
  } };
  document.documentElement.dataset.ready = performance.now().toFixed(1);
})();
