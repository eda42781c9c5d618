// LumoTree dashboard: plots (plotly.js served by the app itself) and live progress polling.
"use strict";
const LumoTree = (() => {
  const config = { displaylogo: false, responsive: true };
  const layout = (extra) => Object.assign({ margin: { l: 60, r: 20, t: 30, b: 50 }, font: { size: 12 }, height: 360 }, extra);
  const fmt = (v, d = 2) => (v === null || v === undefined) ? "–" : (typeof v === "number" ? v.toLocaleString(undefined, { maximumFractionDigits: d, minimumFractionDigits: Number.isInteger(v) ? 0 : d }) : String(v));
  const pct = (v) => (v === null || v === undefined) ? "–" : (100 * v).toFixed(1) + "%";
  const active = (status) => status === "running" || status === "pending";

  function drawScatter(sc) {
    const trace = {
      type: "scatter", mode: "markers+text", name: "arms", x: sc.x, y: sc.y, text: sc.name, textposition: "top center",
      customdata: sc.n, marker: { size: 12 },
      error_x: { type: "data", symmetric: false, array: sc.x_plus, arrayminus: sc.x_minus },
      error_y: { type: "data", symmetric: false, array: sc.y_plus, arrayminus: sc.y_minus },
      hovertemplate: "%{text}<br>%{x:.2f} tok/s<br>solve rate %{y:.1%} (n=%{customdata})<extra></extra>",
    };
    Plotly.react("scatter", [trace], layout({
      xaxis: { title: { text: "decode tok/s (pooled; bars: per-attempt range)" }, rangemode: "tozero" },
      yaxis: { title: { text: "solve rate (95% Wilson)" }, range: [0, 1.12], tickformat: ".0%" },
    }), config);
  }

  function updateProgress(d) {
    const p = d.progress;
    document.querySelector("#progress .fill").style.width = (p.total ? 100 * p.done / p.total : 0) + "%";
    document.querySelector("#progress .counts").textContent =
      `${p.done} / ${p.total} done · ${p.running} running · ${p.pending} pending · ${p.error} errors · ${p.resolved} resolved`;
    const status = document.getElementById("status");
    status.textContent = d.sweep.status;
    status.className = "status " + d.sweep.status;
  }

  function updateArms(arms) {
    for (const a of arms) {
      const row = document.querySelector(`#arms tr[data-arm="${a.id}"]`);
      if (!row) continue;
      const cells = [a.name, a.model, `${a.done} / ${a.attempts}`, a.resolved,
        `${pct(a.solve_rate)} (${pct(a.solve_low)}–${pct(a.solve_high)})`, fmt(a.requests), fmt(a.prompt_tokens),
        fmt(a.completion_tokens), fmt(a.decode_tok_s), `${fmt(a.tok_s_min)}–${fmt(a.tok_s_max)}`,
        pct(a.acceptance_rate), fmt(a.acceptance_length), fmt(a.wall_seconds / 60, 1)];
      cells.forEach((text, i) => { row.children[i].textContent = text; });
    }
  }

  function updateMatrix(m) {
    // cells: [attempt id, attempt index, status, resolved, tok/s]
    for (const row of m.rows) for (const cells of row.cells) for (const [id, , status, resolved] of cells) {
      const el = document.getElementById("a" + id);
      if (el) el.className = "cell " + (resolved ? "resolved" : (status === "done" ? "unresolved" : status));
    }
  }

  function sweepPage(data, pollMs) {
    drawScatter(data.scatter);
    if (!active(data.sweep.status)) return;
    const id = data.sweep.id;
    const timer = setInterval(async () => {
      try {
        const d = await (await fetch(`/api/sweeps/${id}`)).json();
        updateProgress(d); updateArms(d.arms); drawScatter(d.scatter);
        updateMatrix(await (await fetch(`/api/sweeps/${id}/matrix`)).json());
        if (!active(d.sweep.status)) clearInterval(timer);
      } catch (err) {
        console.warn("progress poll failed; retrying", err);  // the server may be restarting
      }
    }, pollMs);
  }

  function attemptPage(data) {
    const reqs = data.requests;
    Plotly.newPlot("tok-s", [{
      type: "bar", x: reqs.map((r) => r.index), y: reqs.map((r) => r.decode_tok_s), name: "decode tok/s",
      hovertemplate: "request %{x}<br>%{y:.2f} tok/s<extra></extra>",
    }], layout({ title: { text: "decode tok/s per request" }, xaxis: { title: { text: "request" }, dtick: 1 }, yaxis: { title: { text: "tok/s" } } }), config);
    const h = data.histogram;
    Plotly.newPlot("acceptance", [{
      type: "bar", x: h.position, y: h.rate, customdata: h.accepted, name: "acceptance",
      hovertemplate: "position %{x}<br>rate %{y:.1%} (%{customdata} accepted)<extra></extra>",
    }], layout({
      title: { text: h.drafts ? `acceptance by draft position (${h.drafts} drafts)` : "no speculative drafts (AR)" },
      xaxis: { title: { text: "draft position" }, dtick: 1 }, yaxis: { title: { text: "accepted / drafts" }, range: [0, 1], tickformat: ".0%" },
    }), config);
  }

  function replayPage(data) {
    const s = data.summary;
    Plotly.newPlot("replay-rates", [{
      type: "bar", x: s.map((a) => a.arm), y: s.map((a) => a.pooled_tok_s), name: "pooled tok/s",
      error_y: { type: "data", symmetric: false, array: s.map((a) => a.max_tok_s - a.pooled_tok_s), arrayminus: s.map((a) => a.pooled_tok_s - a.min_tok_s) },
    }], layout({ title: { text: "pooled decode tok/s (bars: range over runs)" }, yaxis: { title: { text: "tok/s" } } }), config);
    Plotly.newPlot("replay-positions", s.filter((a) => a.per_position.length).map((a) => ({
      type: "scatter", mode: "lines+markers", name: a.arm, x: a.per_position.map((_, i) => i + 1), y: a.per_position,
    })), layout({ title: { text: "per-position acceptance" }, xaxis: { title: { text: "draft position" }, dtick: 1 }, yaxis: { range: [0, 1], tickformat: ".0%" } }), config);
  }

  return { sweepPage, attemptPage, replayPage };
})();
