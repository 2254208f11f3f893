// The page of `meshtrain report` (src/obs/report.cpp embeds it after uPlot): reads the data
// in <script id="mt-data"> and draws every chart with uPlot. After drawing it records in
// document.body.dataset.mtCheck what a test reads back: each chart's number of data points
// and of painted pixels in its plot area, and every script error.
"use strict";
(function () {
  const errors = [];
  window.addEventListener("error", (e) => errors.push(String(e.message || e)));
  window.addEventListener("unhandledrejection", (e) => errors.push(String(e.reason)));
  const consoleError = console.error.bind(console);
  console.error = (...a) => { errors.push(a.map(String).join(" ")); consoleError(...a); };

  const D = JSON.parse(document.getElementById("mt-data").textContent);
  const charts = {};  // id -> {plot: uPlot, points: n}
  const palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                   "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  const categoryColor = {parameters: "#4e79a7", gradients: "#f28e2b", optimizer: "#59a14f",
                         activations: "#e15759", communication: "#b07aa1", workspace: "#9c755f"};
  const kindColor = {forward: "#4e79a7", backward: "#e15759", weight: "#59a14f",
                     send: "#9c755f", recv: "#bab0ac"};

  // ---- formatting
  const si = (v, unit) => {
    if (v == null || !isFinite(v)) return "";
    const a = Math.abs(v);
    for (const [s, k] of [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]])
      if (a >= s) return +(v / s).toPrecision(3) + " " + k + unit;
    return +v.toPrecision(3) + (unit ? " " + unit : "");
  };
  const bytes = (v) => {
    if (v == null || !isFinite(v)) return "";
    const a = Math.abs(v);
    for (const [s, k] of [[2 ** 40, "TiB"], [2 ** 30, "GiB"], [2 ** 20, "MiB"], [2 ** 10, "KiB"]])
      if (a >= s) return +(v / s).toPrecision(3) + " " + k;
    return v + " B";
  };
  const el = (tag, attrs, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    for (const k of kids) e.append(k);
    return e;
  };

  // ---- the header: one block per run (command, model, layout, machine, commit)
  const header = document.getElementById("mt-header");
  header.append(el("h1", {}, D.title || "meshtrain report: " + D.runs.map((r) => r.label).join(", ")));
  const table = el("table", {class: "runs"});
  table.append(el("tr", {}, ...["run", "model", "layout", "machine", "commit / started",
                                "command", "final loss", "tokens/s (median)"].map((h) => el("th", {}, h))));
  const median = (xs) => {
    const v = xs.filter((x) => x != null).sort((a, b) => a - b);
    return v.length ? v[Math.floor(v.length / 2)] : null;
  };
  const last = (xs) => { for (let i = xs.length - 1; i >= 0; --i) if (xs[i] != null) return xs[i]; return null; };
  D.runs.forEach((r, i) => {
    const h = r.run || {};
    const m = h.model || {}, l = h.layout || {}, mc = h.machine || {};
    const model = h.model ? `${m.name}: ${m.n_layer} layers, d_model ${m.d_model}, ${m.n_head} heads` +
      (m.n_kv_head && m.n_kv_head != m.n_head ? ` (${m.n_kv_head} kv)` : "") +
      `, vocab ${m.vocab}, seq ${m.seq}, ${si(m.params, "")} params` : "(not recorded)";
    // cp: the header's, or what the world holds beyond dp × tp × pp (world = pp dp cp tp).
    const cp = l.cp || (l.world && l.dp * l.tp * l.pp ? Math.round(l.world / (l.dp * l.tp * l.pp)) : 1);
    const layout = h.layout ? `dp ${l.dp}${l.ep > 1 ? ` (experts over ep ${l.ep})` : ""} × tp ${l.tp}${l.sp ? " (sp)" : ""} × pp ${l.pp}` +
      (cp > 1 ? ` × cp ${cp}` : "") + (l.pp > 1 ? ` (${l.schedule}, ${l.microbatches} microbatches)` : "") +
      `, ZeRO-${l.zero}, ${l.dtype}, recompute ${l.recompute}; batch ${h.batch} × ${m.seq}` : "(not recorded)";
    const machine = h.machine ? `${mc.host}: ${mc.cpu}, ${mc.cores} cores, ${mc.threads_per_rank} thread(s)/rank, ` +
      `${mc.device}, ${mc.backend} backend` : "(not recorded)";
    const swatch = el("span", {class: "swatch", style: `background:${palette[i % palette.length]}`});
    const c = r.columns;
    const fl = last(c.loss || []), fv = last(c.val_loss || []);
    table.append(el("tr", {}, el("td", {}, swatch, r.label), el("td", {}, model), el("td", {}, layout),
                    el("td", {}, machine), el("td", {}, `${h.commit || "?"} / ${h.started || "?"}`),
                    el("td", {class: "cmd"}, h.command || "(not recorded)"),
                    el("td", {}, (fl != null ? fl.toFixed(4) : "") + (fv != null ? ` (val ${fv.toFixed(4)})` : "")),
                    el("td", {}, si(median(c.tokens_per_s || []), ""))));
  });
  if (D.runs.length) header.append(table);

  // ---- charts
  const main = document.getElementById("mt-charts");
  const section = (title) => { const s = el("section", {}, el("h2", {}, title)); main.append(s); return s; };
  const width = () => Math.max(420, Math.floor((main.clientWidth || 1200) / 2) - 24);
  // A chart: a titled box, uPlot inside, registered for the page's check.
  function chart(parent, id, title, opts, data, note) {
    const box = el("div", {class: "chart", id: "chart-" + id}, el("h3", {}, title));
    parent.append(box);
    const plot = new uPlot(Object.assign({width: width(), height: 300, legend: {live: false}}, opts), data, box);
    if (note) box.append(el("p", {class: "note"}, note));
    let points = 0;
    for (let s = 1; s < data.length; ++s) points += data[s].filter((v) => v != null).length;
    charts[id] = {plot, points};
    return plot;
  }
  // An axis: its label, and its tick labels through `values` (a number -> text function).
  // The y axis is wide enough for "9.54 MiB" beside its label; bytes tick at powers of 2.
  const axis = (label, values) => Object.assign(
      {label, labelSize: 18, labelGap: 4, size: 44, gap: 4, grid: {stroke: "#e4e4e4"}},
      values ? {values: (u, vs) => vs.map(values)} : {},
      values === bytes ? {incrs: Array.from({length: 56}, (_, k) => 2 ** k)} : {});
  // Steps are whole numbers: ticks at 1, 2, 5, 10, 20, ... steps apart.
  const stepIncrs = Array.from({length: 30}, (_, k) => [1, 2, 5][k % 3] * 10 ** Math.floor(k / 3));
  const xaxis = (label, values) => Object.assign(axis(label, values), label === "step" ? {incrs: stepIncrs} : {});
  const yaxis = (label, values) => Object.assign(axis(label, values), {size: 84});
  // Several runs' columns on one x axis: uPlot.join aligns them (null where a run has no row).
  function overlay(xKey, yKey, scale) {
    const tables = [], series = [];
    D.runs.forEach((r, i) => {
      const x = r.columns[xKey], y = r.columns[yKey];
      if (!x || !y) return;
      const xs = [], ys = [];
      x.forEach((xv, k) => { if (xv != null && y[k] != null) { xs.push(xv); ys.push(y[k] * (scale || 1)); } });
      if (!xs.length) return;
      tables.push([xs, ys]);
      series.push({run: i, label: r.label});
    });
    return tables.length ? {data: uPlot.join(tables), series} : null;
  }
  function lineChart(parent, id, title, xKey, xLabel, yKeys, yLabel, yFmt) {
    // yKeys: [[key, name suffix, dashed, scale]]
    const tables = [], series = [{}];
    for (const [key, suffix, dashed, scale] of yKeys) {
      const o = overlay(xKey, key, scale);
      if (!o) continue;
      const n = o.data.length - 1;
      for (let s = 1; s <= n; ++s) tables.push([o.data[0], o.data[s]]);
      o.series.forEach((s) => series.push({
        label: s.label + suffix, stroke: palette[s.run % palette.length], width: dashed ? 2 : 1.5,
        dash: dashed ? [6, 4] : undefined, spanGaps: true,
        points: {show: !!dashed, size: 6, fill: palette[s.run % palette.length]},
        value: (u, v) => (v == null ? "" : yFmt ? yFmt(v) : +v.toPrecision(4)),
      }));
    }
    if (!tables.length || !parent) return null;
    const data = uPlot.join(tables);
    return chart(parent, id, title, {
      scales: {x: {time: false}},
      axes: [xaxis(xLabel, xKey == "tokens" ? (v) => si(v, "") : null), yaxis(yLabel, yFmt)],
      series,
    }, data);
  }

  const curves = D.runs.length ? section("Training curves") : null;
  lineChart(curves, "loss-step", "Loss against step", "step", "step",
            [["loss", " loss", false], ["val_loss", " val loss", true]], "loss (nats/token)");
  lineChart(curves, "loss-tokens", "Loss against tokens", "tokens", "tokens trained",
            [["loss", " loss", false], ["val_loss", " val loss", true]], "loss (nats/token)");
  // Training time so far: the steps' time_s summed (evaluation and checkpoints not counted).
  D.runs.forEach((r) => {
    let t = 0;
    r.columns.elapsed = (r.columns.time_s || []).map((v) => (v == null ? null : (t += v)));
  });
  lineChart(curves, "loss-time", "Loss against training time", "elapsed", "seconds of training",
            [["loss", " loss", false], ["val_loss", " val loss", true]], "loss (nats/token)");
  lineChart(curves, "tokens-per-s", "Throughput", "step", "step",
            [["tokens_per_s", "", false]], "tokens/s", (v) => si(v, ""));
  lineChart(curves, "mfu", "Model FLOPs utilisation", "step", "step",
            [["mfu", "", false, 100]], "MFU (%)", (v) => +v.toPrecision(3) + "%");
  lineChart(curves, "lr", "Learning rate", "step", "step", [["lr", "", false]], "learning rate",
            (v) => v.toExponential(1));
  lineChart(curves, "grad-norm", "Gradient norm (before clipping)", "step", "step",
            [["grad_norm", "", false]], "global L2 norm");

  // ---- memory: per run, each rank's peak bytes by category as stacked bars
  const categoryBars = (labels) => ({
    scales: {x: {time: false, range: [-0.6, labels.length - 0.4]}},
    axes: [axis("", null), axis("", null)],
  });
  const memSection = D.runs.some((r) => r.memory) ? section("Peak memory per rank") : null;
  D.runs.forEach((r, i) => {
    const m = r.memory;
    if (!m) return;
    const ranks = m.peak_bytes.length, cats = m.categories;
    const x = [...Array(ranks).keys()];
    // Drawn tallest first: series k covers categories 0..k, so each visible band is one
    // category, stacked in the categories' order from the axis up.
    const used = cats.map((c, k) => k).filter((k) => m.peak_bytes.some((row) => row[k] > 0));
    const series = [{}], data = [x];
    for (let j = used.length - 1; j >= 0; --j) {
      const k = used[j];
      data.push(m.peak_bytes.map((row) => used.slice(0, j + 1).reduce((s, q) => s + row[q], 0)));
      series.push({label: cats[k], fill: categoryColor[cats[k]] || palette[k], stroke: "#ffffff", width: 1,
                   paths: uPlot.paths.bars({size: [0.6, 80], align: 0}), points: {show: false},
                   value: (u, v, si_, di) => bytes(m.peak_bytes[di][k])});
    }
    const opts = categoryBars(x);
    opts.axes[0] = Object.assign(axis("rank (the worst marked *)", null), {
      splits: () => x, values: (u, vs) => vs.map((v) => (v === m.worst_rank ? `${v} *` : `${v}`))});
    opts.axes[1] = yaxis("peak bytes", bytes);
    opts.scales.y = {range: (u, mn, mx) => [0, mx * 1.08]};
    chart(memSection, "memory-" + i, `${r.label}: worst rank ${m.worst_rank} peaks at ` +
          bytes(m.total_peak_bytes[m.worst_rank]), Object.assign(opts, {series}), data);
  });

  // ---- bytes per step by mesh dimension
  const dims = ["dp", "tp", "pp", "cp", "ep", "outer"];
  const traffic = D.runs.some((r) => dims.some((d) => (r.columns[d + "_bytes"] || []).some((v) => v > 0)))
    ? section("Communication per step (bytes received, all ranks)") : null;
  D.runs.forEach((r, i) => {
    const present = dims.filter((d) => (r.columns[d + "_bytes"] || []).some((v) => v > 0));
    if (!present.length) return;
    const step = r.columns.step;
    const data = [step], series = [{}];
    present.forEach((d, k) => {
      data.push(r.columns[d + "_bytes"]);
      series.push({label: d, stroke: palette[k], width: 1.5, spanGaps: true, value: (u, v) => bytes(v)});
    });
    chart(traffic, "bytes-" + i, `${r.label}: bytes per step by mesh dimension`, {
      scales: {x: {time: false}, y: {range: (u, mn, mx) => [0, mx * 1.1]}},
      axes: [xaxis("step", null), yaxis("bytes per step", bytes)], series}, data);
  });

  // ---- the pipeline timeline: one lane per rank, a box per F/B/W, sends and receives as
  // thin bars; idle time is left blank, so the gaps are the bubbles. It opens on the last
  // step (microbatch 0 of chunk 0, F0.0, starts each step).
  if (D.trace) {
    const t = D.trace, lanes = t.lanes;
    const drawn = (kind) => kind !== "idle";
    const kinds = [...new Set(t.cat)].filter(drawn);
    const order = ["forward", "backward", "weight", "send", "recv"];
    kinds.sort((a, b) => (order.indexOf(a) + 99) % 99 - (order.indexOf(b) + 99) % 99);
    const t0 = Math.min(...t.start_ms), t1 = Math.max(...t.start_ms.map((s, k) => s + t.dur_ms[k]));
    // The last step begins at the earliest of the first stage's ranks' last F0.0: ranks of
    // different replicas need not start it together (on a shared host they take turns).
    const lastF0 = new Map();
    let steps = 0;
    t.name.forEach((n, k) => {
      if (n !== "F0.0") return;
      if (t.rank[k] === 0) ++steps;
      lastF0.set(t.rank[k], Math.max(lastF0.get(t.rank[k]) ?? -Infinity, t.start_ms[k]));
    });
    const stepStart = lastF0.size ? Math.min(...lastF0.values()) : t0;
    const laneOf = (rank) => lanes - 1 - rank;  // rank 0 on top
    const boxes = (kind) => (u) => {
      const p = new Path2D(), h = kind === "send" || kind === "recv" ? 0.1 : 0.38;
      for (let k = 0; k < t.cat.length; ++k) {
        if (t.cat[k] !== kind) continue;
        const x0 = u.valToPos(t.start_ms[k], "x", true), x1 = u.valToPos(t.start_ms[k] + t.dur_ms[k], "x", true);
        const y0 = u.valToPos(laneOf(t.rank[k]) + h, "y", true), y1 = u.valToPos(laneOf(t.rank[k]) - h, "y", true);
        p.rect(x0, y0, Math.max(1, x1 - x0), y1 - y0);
      }
      return {stroke: p, fill: p};
    };
    const names = {forward: "F (forward)", backward: "B (backward)", weight: "W (weight gradients)",
                   send: "send", recv: "receive"};
    const series = [{}], data = [[t0, t1]];
    for (const kind of kinds) {
      const n = t.cat.filter((c) => c === kind).length;
      series.push({label: `${names[kind] || kind}: ${n}`, fill: kindColor[kind] || "#999", stroke: "#333",
                   width: 0.5, paths: boxes(kind), points: {show: false}});
      data.push([laneOf(0), laneOf(0)]);  // unused by the boxes: uPlot draws a series with data
    }
    const lanesX = [...Array(lanes).keys()];
    const sec = section("Pipeline timeline");
    const plot = chart(sec, "timeline", `${lanes} ranks, ${t.cat.length} events, ${steps || "?"} steps over ` +
          `${(t1 - t0).toFixed(1)} ms; showing the last step (blank: idle, the bubbles; drag to zoom, ` +
          "double-click for the whole trace)", {
      width: Math.max(840, (main.clientWidth || 1200) - 24), height: 90 + 40 * lanes,
      scales: {x: {time: false}, y: {range: [-0.6, lanes - 0.4]}},
      axes: [axis("time since the trace began (ms)", null), Object.assign(yaxis("", null), {
        splits: () => lanesX, values: (u, vs) => vs.map((v) => `rank ${lanes - 1 - v}`)})],
      series}, data);
    plot.setScale("x", {min: stepStart, max: t1});
  }

  // ---- predicted (plan / simulate) against measured
  if (D.plan) {
    const p = D.plan;
    const sec = section(`Predicted (${p.file.split("/").pop()}) against measured (${D.runs[0].label})`);
    const r = D.runs[0], c = r.columns;
    // Step time: measured per step, the prediction as a flat line.
    if (c.time_s && p.step_time_s != null)
      chart(sec, "plan-step-time", "Step time: measured against predicted", {
        scales: {x: {time: false}, y: {range: (u, mn, mx) => [0, Math.max(mx, p.step_time_s) * 1.15]}},
        axes: [xaxis("step", null), yaxis("step time (s)", (v) => +v.toPrecision(3) + " s")],
        series: [{}, {label: "measured", stroke: palette[0], width: 1.5},
                 {label: "predicted", stroke: palette[1], width: 2, dash: [8, 5]}]},
        [c.step, c.time_s, c.step.map(() => p.step_time_s)]);
    if (c.bubble && p.bubble_fraction != null)
      chart(sec, "plan-bubble", "Pipeline bubble: measured against predicted", {
        scales: {x: {time: false}, y: {range: [0, 100]}},
        axes: [xaxis("step", null), yaxis("bubble (% of step)", (v) => v + "%")],
        series: [{}, {label: "measured", stroke: palette[0], width: 1.5},
                 {label: "predicted", stroke: palette[1], width: 2, dash: [8, 5]}]},
        [c.step, c.bubble.map((v) => (v == null ? null : 100 * v)), c.step.map(() => 100 * p.bubble_fraction)]);
    // Memory by category: the plan's worst stage against the measured worst rank.
    if (p.memory_bytes_per_gpu && r.memory) {
      const cats = r.memory.categories, m = r.memory;
      const short = {communication: "comm."};  // the axis has ~80 px per category
      const x = [...cats.keys()];
      const measured = cats.map((cat, k) => m.peak_bytes[m.worst_rank][k]);
      const predicted = cats.map((cat) => (p.memory_bytes_per_gpu[cat] == null ? null : p.memory_bytes_per_gpu[cat]));
      chart(sec, "plan-memory", `Memory by category: worst rank ${m.worst_rank} against the plan`, {
        scales: {x: {time: false, range: [-0.6, cats.length - 0.4]}, y: {range: (u, mn, mx) => [0, mx * 1.1]}},
        axes: [Object.assign(axis("", null), {splits: () => x, values: (u, vs) => vs.map((v) => short[cats[v]] || cats[v] || "")}),
               yaxis("peak bytes", bytes)],
        series: [{}, {label: "predicted", fill: palette[1], stroke: palette[1], points: {show: false},
                      paths: uPlot.paths.bars({size: [0.35, 50], align: -1}), value: (u, v) => bytes(v)},
                 {label: "measured", fill: palette[0], stroke: palette[0], points: {show: false},
                  paths: uPlot.paths.bars({size: [0.35, 50], align: 1}), value: (u, v) => bytes(v)}]},
        [x, predicted, measured], "Categories the planner does not model (workspace) have no predicted bar.");
    }
  }

  // ---- mixture of experts: per run, the routing of every MoE layer (the rows' "moe")
  // A heat map drawn by uPlot's own bars: one series per row of cells, each cell a bar from
  // y0 to y1 (disp.y0 / disp.y1) in a colour of its own (disp.fill: a colour per value);
  // the values are written in the cells when they fit, and the cell under the pointer is
  // named below the chart.
  const viridis = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89",
                   "#35b779", "#6ece58", "#b5de2b", "#fde725"];
  const colorOf = (t) => viridis[Math.max(0, Math.min(viridis.length - 1, Math.floor(t * viridis.length)))];
  // h: {xs, xLabel, xName(x), rows: [{name, values}] (top to bottom), what, fmt, from0, note}
  function heatmap(parent, id, title, h) {
    const all = h.rows.flatMap((r) => r.values).filter((v) => v != null);
    // The colours run from 0 (h.from0: where 0 means something, e.g. an even load) or from
    // the lowest value, to the highest; the colour bar names both ends.
    const lo = h.from0 ? Math.min(0, ...all) : Math.min(...all), hi = Math.max(...all, lo + 1e-12);
    const t = (v) => (v - lo) / (hi - lo);
    const n = h.rows.length, rowY = (k) => n - 1 - k;  // the first row on top
    const series = [{}], data = [h.xs];
    h.rows.forEach((r, k) => {
      data.push(r.values.map((v) => (v == null ? null : rowY(k) + 0.45)));
      series.push({label: r.name, width: 0, points: {show: false}, paths: uPlot.paths.bars({
        size: [h.xs.length > 30 ? 1 : 0.94, Infinity], disp: {
          y0: {unit: 1, values: () => r.values.map(() => rowY(k) - 0.45)},
          y1: {unit: 1, values: () => r.values.map(() => rowY(k) + 0.45)},
          fill: {unit: 3, values: () => r.values.map((v) => (v == null ? null : colorOf(t(v))))}}})});
    });
    const rowsY = [...Array(n).keys()];
    const readout = el("p", {class: "note"}, "\u00a0");
    const xr = [Math.min(...h.xs) - 0.5, Math.max(...h.xs) + 0.5];
    const plot = chart(parent, id, title, {
      height: Math.max(160, 70 + 44 * n), legend: {show: false}, cursor: {drag: {x: false}},
      scales: {x: {time: false, range: xr}, y: {range: [-0.5, n - 0.5]}},
      axes: [Object.assign(xaxis(h.xLabel, null), h.xs.length <= 16 ? {splits: () => h.xs} : {}),
             Object.assign(yaxis("", null), {splits: () => rowsY, values: (u, vs) => vs.map((v) => h.rows[n - 1 - v].name)})],
      series,
      hooks: {
        draw: [(u) => {  // the values in their cells, where a cell is wide enough
          const w = u.valToPos(1, "x", true) - u.valToPos(0, "x", true);
          if (w < 34 * devicePixelRatio) return;
          const ctx = u.ctx;
          ctx.save();
          ctx.font = `${Math.round(11 * devicePixelRatio)}px "DejaVu Sans", sans-serif`;
          ctx.textAlign = "center";
          ctx.textBaseline = "middle";
          h.rows.forEach((r, k) => r.values.forEach((v, i) => {
            if (v == null) return;
            ctx.fillStyle = t(v) > 0.6 ? "#000" : "#fff";
            ctx.fillText(h.fmt(v), u.valToPos(h.xs[i], "x", true), u.valToPos(rowY(k), "y", true));
          }));
          ctx.restore();
        }],
        setCursor: [(u) => {
          const {left, top} = u.cursor;
          if (left == null || left < 0) { readout.textContent = "\u00a0"; return; }
          const x = Math.round(u.posToVal(left, "x")), k = n - 1 - Math.round(u.posToVal(top, "y"));
          const i = h.xs.indexOf(x);
          if (i < 0 || k < 0 || k >= n) return;
          readout.textContent = `${h.rows[k].name}, ${h.xName ? h.xName(x) : x}: ${h.fmt(h.rows[k].values[i])} ${h.what}`;
        }],
      }}, data);
    // The colour scale: the map's colours from its lowest to its highest value.
    const box = document.getElementById("chart-" + id);
    box.append(el("div", {class: "colorbar"}, el("span", {}, h.fmt(lo)),
                  el("span", {class: "ramp", style: `background:linear-gradient(to right,${viridis.join(",")})`}),
                  el("span", {}, `${h.fmt(hi)} ${h.what}`)), readout);
    if (h.note) box.append(el("p", {class: "note"}, h.note));
    charts[id].points = all.length;
    charts[id].cells = h.rows.map((r) => r.values);  // for the test: the numbers drawn
    return plot;
  }
  D.runs.forEach((r, i) => {
    const rows = (r.moe || []).map((m) => (m && Array.isArray(m.layers) ? m : null));
    if (!rows.some((m) => m)) return;
    const steps = r.columns.step, at = rows.map((m, k) => (m ? k : -1)).filter((k) => k >= 0);
    const layers = rows[at[at.length - 1]].layers.map((L) => L.layer);
    const sec = section(`Mixture of experts: ${r.label} (${layers.length} MoE layers)`);
    const layerOf = (m, l) => (m ? m.layers.find((L) => L.layer === l) : null);
    // Tokens per expert (a "tokens" list per layer, when the rows carry one): the mean over
    // the steps that have it. Without it, the imbalance that every row carries: the CV of the
    // tokens per expert, per layer and step.
    const withTokens = at.filter((k) => rows[k].layers.every((L) => Array.isArray(L.tokens)));
    if (withTokens.length) {
      const E = rows[withTokens[0]].layers[0].tokens.length;
      const mean = (l, e) => withTokens.reduce((s, k) => s + layerOf(rows[k], l).tokens[e], 0) / withTokens.length;
      heatmap(sec, "moe-experts-" + i, `Tokens routed to each expert (mean per step over ${withTokens.length} steps)`, {
        xs: [...Array(E).keys()], xLabel: "expert", xName: (e) => `expert ${e}`, what: "tokens",
        rows: layers.map((l) => ({name: `layer ${l}`, values: [...Array(E).keys()].map((e) => mean(l, e))})),
        fmt: (v) => (v == null ? "" : si(v, ""))});
    } else {
      heatmap(sec, "moe-imbalance-" + i, "Load imbalance: CV of tokens per expert, per layer and step", {
        xs: at.map((k) => steps[k]), xLabel: "step", what: "CV (std / mean of tokens per expert; 0 = even)", from0: true,
        rows: layers.map((l) => ({name: `layer ${l}`, values: at.map((k) => (layerOf(rows[k], l) || {}).cv)})),
        fmt: (v) => (v == null ? "" : v.toFixed(2)),
        note: "The metrics hold each layer's CV, fewest and most tokens per expert, not every expert's count."});
    }
    // The curves: one line per layer against step.
    function perLayer(id, title, key, yLabel, fmt, scale, total) {
      const data = [steps], series = [{}];
      layers.forEach((l, k) => {
        data.push(rows.map((m) => { const L = layerOf(m, l); return L && L[key] != null ? L[key] * scale : null; }));
        series.push({label: `layer ${l}`, stroke: palette[k % palette.length], width: 1.5, spanGaps: true,
                     value: (u, v) => (v == null ? "" : fmt(v))});
      });
      if (total) {
        data.push(rows.map((m) => (m && m[total] != null ? m[total] * scale : null)));
        series.push({label: "all layers", stroke: "#222", width: 2, dash: [6, 4], spanGaps: true,
                     value: (u, v) => (v == null ? "" : fmt(v))});
      }
      chart(sec, `${id}-${i}`, title, {scales: {x: {time: false}, y: {range: (u, mn, mx) => [0, Math.max(mx, 1e-9) * 1.1]}},
                                        axes: [xaxis("step", null), yaxis(yLabel, fmt)], series}, data);
    }
    // The CV's curves where the heat map is the experts' (else the map is the CV's), and the
    // fewest and most tokens an expert of each layer got.
    if (withTokens.length)
      perLayer("moe-cv", "Load imbalance per layer (CV of tokens per expert)", "cv", "CV (0 = even)", (v) => v.toFixed(2), 1);
    {
      const data = [steps], series = [{}];
      layers.forEach((l, k) => [["tokens_max", "most", null], ["tokens_min", "fewest", [4, 3]]].forEach(([key, name, dash]) => {
        data.push(rows.map((m) => { const L = layerOf(m, l); return L ? L[key] : null; }));
        series.push({label: `layer ${l} ${name}`, stroke: palette[k % palette.length], width: 1.5, dash, spanGaps: true,
                     value: (u, v) => (v == null ? "" : si(v, ""))});
      }));
      chart(sec, `moe-tokens-${i}`, "Tokens per expert: the most (solid) and fewest (dashed) an expert got", {
        scales: {x: {time: false}, y: {range: (u, mn, mx) => [0, Math.max(mx, 1) * 1.1]}},
        axes: [xaxis("step", null), yaxis("tokens per step", (v) => si(v, ""))], series}, data);
    }
    perLayer("moe-dropped", "Assignments dropped by the expert capacity", "dropped", "dropped (% of assignments)",
             (v) => +v.toPrecision(3) + "%", 100, "dropped");
    perLayer("moe-aux", "Load-balancing loss E·Σ f·P per layer (1 = even, E = one expert)", "aux", "aux loss (unweighted)",
             (v) => v.toFixed(3), 1);
    perLayer("moe-z", "Router z-loss per layer (mean logsumexp² of the logits)", "z", "z loss (unweighted)",
             (v) => +v.toPrecision(3), 1);
  });

  // ---- plan --html: the ranked layouts, a table and their memory and time as stacked bars
  if (D.ranked) {
    const P = D.ranked, L = P.layouts || [];
    const sec = section(`${L.length} ranked layouts (of ${P.considered} considered, ${P.fit} fit in memory)`);
    const name = (l) => `dp ${l.dp} tp ${l.tp}${l.sp ? "+sp" : ""} pp ${l.pp}` + (l.cp > 1 ? ` cp ${l.cp}` : "") +
      (l.virtual_stages > 1 ? ` v ${l.virtual_stages}` : "");
    const t = el("table", {class: "runs"});
    t.append(el("tr", {}, ...["#", "layout", "microbatch × count", "ZeRO", "recompute", "schedule", "step time",
                              "tokens/s", "MFU", "bubble", "memory per GPU", "fits"].map((h) => el("th", {}, h))));
    L.forEach((l, i) => t.append(el("tr", {}, ...[i + 1, name(l), `${l.microbatch} × ${l.microbatches}`, l.zero,
      l.recompute, l.pp > 1 ? l.schedule : "", (+l.step_time_s.toPrecision(3)) + " s", si(l.tokens_per_s, ""),
      (100 * l.mfu).toFixed(1) + "%", (100 * l.bubble_fraction).toFixed(1) + "%",
      `${bytes(l.memory_bytes_per_gpu.total)} of ${bytes(l.hbm_bytes_per_gpu)}`, l.fits ? "yes" : "no"]
      .map((v) => el("td", {}, String(v))))));
    sec.append(el("div", {class: "wide"}, t));
    const x = L.map((l, i) => i);
    const xAxis = Object.assign(axis("layout (rank in the table)", null), {splits: () => x, values: (u, vs) => vs.map((v) => `#${v + 1}`)});
    // Stacked bars from parts: drawn tallest (cumulative) first, so each band is one part.
    function stacked(id, title, parts, yLabel, fmt) {
      const series = [{}], data = [x];
      for (let j = parts.length - 1; j >= 0; --j) {
        const [label, color, get] = parts[j];
        data.push(L.map((l) => parts.slice(0, j + 1).reduce((s, p) => s + Math.max(0, p[2](l)), 0)));
        series.push({label, fill: color, stroke: "#ffffff", width: 1, points: {show: false},
                     paths: uPlot.paths.bars({size: [0.6, 60], align: 0})});
      }
      chart(sec, id, title, {
        scales: {x: {time: false, range: [-0.6, L.length - 0.4]}, y: {range: (u, mn, mx) => [0, mx * 1.1]}},
        axes: [xAxis, yaxis(yLabel, fmt)], series}, data);
    }
    const m = (k) => (l) => l.memory_bytes_per_gpu[k] || 0;
    const hbm = Math.min(...L.map((l) => l.hbm_bytes_per_gpu));
    stacked("ranked-memory", `Memory per GPU by category (the worst stage); the GPU has ${bytes(hbm)}`, [
      ["parameters", categoryColor.parameters, m("parameters")], ["gradients", categoryColor.gradients, m("gradients")],
      ["optimizer", categoryColor.optimizer, m("optimizer")],
      ["activations + comm. (or f32 step gradients)", categoryColor.activations,
       (l) => l.memory_bytes_per_gpu.total - m("parameters")(l) - m("gradients")(l) - m("optimizer")(l)]],
      "bytes per GPU", bytes);
    const ts = (k) => (l) => (l.time_s && l.time_s[k]) || 0;
    stacked("ranked-time", "Step time: busiest rank's compute, pipeline waits, exposed communication, optimizer", [
      ["forward", "#4e79a7", ts("forward")], ["backward (+ recompute)", "#e15759", ts("backward")],
      ["pipeline: bubble and p2p", "#bab0ac", (l) => ts("pipeline")(l) - ts("forward")(l) - ts("backward")(l)],
      ["tied embedding sync", "#b07aa1", ts("embedding_sync")], ["exposed dp comm.", "#f28e2b", ts("dp_exposed")],
      ["optimizer", "#59a14f", ts("optimizer")]],
      "seconds per step", (v) => +v.toPrecision(3) + " s");
  }

  // ---- the check a test reads: points per chart, painted pixels in each plot area, errors
  function check() {
    // The content's height (not the window's, which a short page leaves blank below it).
    const out = {errors, charts: {}, height: Math.ceil(document.body.getBoundingClientRect().bottom)};
    for (const [id, c] of Object.entries(charts)) {
      const u = c.plot, b = u.bbox;
      let painted = 0;
      try {
        const px = u.ctx.getImageData(b.left, b.top, Math.max(1, b.width), Math.max(1, b.height)).data;
        // Coloured pixels only: the grid and axes are grey, every series has a hue.
        for (let k = 0; k < px.length; k += 4)
          if (px[k + 3] > 0 && Math.max(px[k], px[k + 1], px[k + 2]) - Math.min(px[k], px[k + 1], px[k + 2]) > 16)
            ++painted;
      } catch (e) { errors.push("getImageData: " + e); }
      out.charts[id] = {points: c.points, painted, width: u.width, height: u.height,
                        series: u.series.length - 1, cells: c.cells};
    }
    document.body.dataset.mtCheck = JSON.stringify(out);
  }
  // uPlot draws in a microtask after each chart is made: a task after them sees every chart
  // drawn (animation frames may not come at all in a headless browser under load).
  setTimeout(check, 0);
})();
