// The robotloop dashboard's pages: each fills its template from the JSON routes and polls them for live updates.
// Every value from robots, jobs and datasets reaches the page as text (textContent / text nodes / setAttribute),
// never as HTML; the one innerHTML is a report's Markdown, which the server renders with raw HTML escaped.
// No token is kept here: signing in sets an HttpOnly session cookie, and every request sends the header
// X-Robotloop-UI, which the server's write routes require (a cross-site form cannot send it).
"use strict";
(() => {
  const HEADER = { "X-Robotloop-UI": "1" };
  const POLL_MS = 2000;
  const $ = (selector) => document.querySelector(selector);
  const enc = encodeURIComponent;
  const state = { write: false, timers: [] };
  window.__robotloop = state; // what the browser tests and benchmarks/ui.py read (timings, plot sizes)

  class SignedOut extends Error {}

  async function api(path, options = {}) {
    const headers = { ...HEADER, ...(options.body ? { "Content-Type": "application/json" } : {}) };
    const response = await fetch(path, { credentials: "same-origin", ...options, headers });
    if (response.status === 401) {
      showLogin();
      throw new SignedOut("signed out");
    }
    const data = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(data.error || `${response.status} ${response.statusText}`);
    return data;
  }

  const post = (path, body) => api(path, { method: "POST", body: JSON.stringify(body) });

  // el("td", {class: "x"}, "text", child): strings become text nodes, never markup.
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs)) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // A link within the dashboard: `path` is built here from encoded parts, so data can never make it javascript:.
  const link = (path, text) => el("a", { href: path.startsWith("/") ? path : "#" }, text);
  const releaseLink = (name) => (name ? link(`/releases/${enc(name)}`, name) : "—");
  const datasetLink = (url, text) => link(`/datasets?url=${enc(url)}`, text || url);
  const runLink = (output) => link(`/runs?output=${enc(output)}`, output);
  const fill = (selector, rows) => $(`${selector} tbody`).replaceChildren(...rows);
  const row = (...cells) => el("tr", {}, ...cells.map((c) => (c instanceof Node && c.tagName === "TD" ? c : el("td", {}, c))));
  const num = (value, digits = 1) => (value === null || value === undefined ? "—" : Number(value).toFixed(digits));
  const pct = (value) => (value === null || value === undefined ? "—" : `${(100 * value).toFixed(1)}%`);
  const when = (at) => (at ? new Date(at * 1000).toLocaleString() : "—");
  const short = (hash) => (hash ? el("code", { title: hash }, hash.slice(0, 12)) : "—");

  function ago(seconds) {
    if (seconds === null || seconds === undefined) return "never";
    if (seconds < 90) return `${seconds.toFixed(0)} s ago`;
    if (seconds < 5400) return `${(seconds / 60).toFixed(0)} min ago`;
    return `${(seconds / 3600).toFixed(1)} h ago`;
  }

  function health(value) {
    if (value === null || value === undefined) return "—";
    if (typeof value === "number") return value.toFixed(2);
    if (typeof value === "object") {
      return Object.entries(value)
        .map(([k, v]) => `${k}: ${typeof v === "number" ? v.toFixed(2) : JSON.stringify(v)}`)
        .join(", ");
    }
    return String(value);
  }

  function say(message) {
    $("#status").textContent = message || "";
  }

  function every(ms, task) {
    const run = async () => {
      try {
        await task();
        say("");
      } catch (error) {
        if (error instanceof SignedOut) return; // the login form is showing; polling stops
        say(error.message);
      }
      if (!$("#main").hidden) state.timers.push(setTimeout(run, ms));
    };
    return run();
  }

  // A confirmation with a reason: resolves to the reason, or null when cancelled.
  function confirmWithReason(text) {
    const dialog = $("#confirm");
    $("#confirm-text").textContent = text;
    $("#confirm-reason").value = "";
    dialog.returnValue = "";
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok" ? $("#confirm-reason").value : null), {
        once: true,
      });
      dialog.showModal();
    });
  }

  async function act(text, path, body = {}) {
    const reason = await confirmWithReason(text);
    if (reason === null) return;
    try {
      await post(path, { ...body, reason });
      say("");
      await pages[document.body.dataset.page]?.refresh?.();
    } catch (error) {
      say(error.message);
    }
  }

  function eventRows(events) {
    return events.map((e) =>
      el(
        "tr",
        { class: `event-${e.kind}` },
        el("td", {}, when(e.at)),
        el("td", {}, e.kind),
        el("td", {}, e.robot || ""),
        el("td", {}, e.channel || ""),
        el("td", {}, releaseLink(e.release)),
        el("td", {}, releaseLink(e.previous)),
        el("td", { class: "detail" }, e.detail || ""),
      ),
    );
  }

  // -- fleet ----------------------------------------------------------------------------------------------
  let channelsShown = "";
  async function fleet() {
    const t0 = performance.now();
    const data = await api("/api/fleet");
    const signature = JSON.stringify([data.channels, data.releases, state.write]);
    if (signature !== channelsShown) {
      // Rebuilt only when something changed, so a half-chosen promotion is not wiped by the next poll.
      channelsShown = signature;
      fill(
        "#channels",
        Object.entries(data.channels).map(([channel, release]) => {
          const actions = [];
          if (state.write) {
            const pick = el("select", { "aria-label": `release for ${channel}` }, ...data.releases.map((r) => el("option", { value: r }, r)));
            if (release) pick.value = release;
            actions.push(
              pick,
              el("button", { type: "button", onclick: () => act(`Promote ${pick.value} to ${channel}?`, `/api/channels/${enc(channel)}/promote`, { release: pick.value }) }, "Promote"),
              el("button", { type: "button", onclick: () => act(`Roll channel ${channel} back to its previous release?`, `/api/channels/${enc(channel)}/rollback`) }, "Roll back"),
            );
          }
          return el("tr", { "data-channel": channel }, el("td", {}, channel), el("td", {}, releaseLink(release)), el("td", {}, ...actions));
        }),
      );
    }
    fill(
      "#robots",
      data.robots.map((r) =>
        el(
          "tr",
          { id: `robot-${r.id}`, "data-robot": r.id, "data-running": r.running || "" },
          el("td", {}, r.id),
          el("td", {}, r.channel, r.pinned ? el("span", { class: "muted" }, " (pinned)") : null),
          el("td", {}, releaseLink(r.assigned)),
          el("td", { class: "running" }, releaseLink(r.running), r.probation ? el("span", { class: "muted" }, " probation") : null),
          el("td", {}, num(r.control_hz)),
          el("td", {}, num(r.max_gap_ms)),
          el("td", {}, health(r.health)),
          el("td", {}, r.episodes ?? "—"),
          el("td", { class: "recorded" }, r.recording ? r.recording.recorded ?? "—" : "—"),
          el("td", { class: `dropped${r.recording?.dropped ? " error" : ""}` }, r.recording ? r.recording.dropped ?? "—" : "—"),
          el("td", { class: "detail recording-error" }, r.recording?.last_error || ""),
          el("td", {}, ago(r.last_seen_s_ago)),
          el(
            "td",
            {},
            state.write
              ? el("button", { type: "button", onclick: () => act(`Pin robot ${r.id} to the release it ran before?`, `/api/robots/${enc(r.id)}/rollback`) }, "Roll back")
              : null,
          ),
        ),
      ),
    );
    $("#robot-count").textContent = `(${data.robots.length})`;
    fill("#events", eventRows(data.events));
    state.fleetRenderMs = performance.now() - t0;
    state.renderedAt ??= performance.now(); // the first render, since the navigation started
  }

  // -- releases -------------------------------------------------------------------------------------------
  async function releases() {
    const data = await api("/api/releases");
    $("#channel-histories").replaceChildren(
      ...Object.entries(data.channels).map(([channel, c]) =>
        el(
          "section",
          { class: "channel" },
          el("h2", {}, `Channel ${channel}: `, releaseLink(c.release)),
          el(
            "table",
            {},
            el("thead", {}, row("when", "event", "robot", "channel", "release", "previous", "reason / detail")),
            el("tbody", {}, ...eventRows(c.events)),
          ),
        ),
      ),
    );
    fill(
      "#release-list",
      [...data.releases].reverse().map((r) => row(releaseLink(r.name), r.checkpoint, when(r.published_at))),
    );
  }

  async function release() {
    const data = await api(`/api/releases/${enc(document.body.dataset.item)}`);
    const facts = [
      ["checkpoint", data.checkpoint],
      ["training run", runLink(data.run)],
      ["loop report", reportLinks(data.reports)],
      ["signed by key", data.key_id],
      ["published", when(data.published_at)],
      ["channels on it", data.channels.length ? data.channels.join(", ") : "none"],
      ["robots on it", data.robots.length ? data.robots.map((r) => link(`/fleet#robot-${enc(r)}`, r)).flatMap((a) => [a, " "]) : "none"],
    ];
    $("#release-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    $("#evaluations").replaceChildren(
      ...(data.evaluations.length
        ? data.evaluations.map((e) =>
            el(
              "div",
              { class: "evaluation" },
              el(
                "p",
                {},
                `${e.task}: success ${pct(e.success_rate)} over ${e.episodes} episodes (95% interval ${pct(e.success_ci95?.[0])} to ${pct(e.success_ci95?.[1])}), mean max reward ${num(e.mean_max_reward, 2)}`,
              ),
              ...(Object.keys(e.failures_by_stage).length
                ? [el("p", {}, `Failed episodes got as far as: ${Object.entries(e.failures_by_stage).map(([stage, n]) => `${stage} ${n}`).join(", ")}`)]
                : []),
              ...e.videos.map((v) => el("video", { controls: true, muted: true, preload: "metadata", src: `/media/report/${enc(e.id)}/${enc(v)}` })),
            ),
          )
        : [el("p", { class: "muted" }, "No evaluation of this release beside its run in the bucket or in the report folders.")]),
    );
    const lineage = data.lineage;
    $("#lineage-summary").replaceChildren(
      `Checkpoint step ${lineage.step ?? "?"}, trained on ${lineage.episodes.length} episodes of `,
      ...lineage.datasets.flatMap((d) => [datasetLink(d), " "]),
    );
    fill(
      "#lineage",
      lineage.episodes.map((e) =>
        row(
          datasetLink(e.dataset),
          link(`/datasets?url=${enc(e.dataset)}&episode=${enc(e.episode_index)}`, `episode ${e.episode_index}`),
          e.length,
          el("td", {}, ...e.files.flatMap((f) => [el("span", {}, `${f.video_key || "data"} `), short(f.xet_hash), el("br")])),
        ),
      ),
    );
    fill("#files", data.files.map((f) => row(f.path, f.size.toLocaleString(), short(f.xet_hash))));
    fill("#events", eventRows(data.events));
  }

  // -- training runs --------------------------------------------------------------------------------------
  async function runs() {
    const only = new URLSearchParams(location.search).get("output");
    const data = await api("/api/runs");
    const jobs = only ? data.jobs.filter((j) => j.output === only) : data.jobs;
    fill(
      "#jobs",
      jobs.map((j) =>
        el(
          "tr",
          { "data-job": j.id },
          el("td", {}, link(`/runs/${enc(j.id)}`, j.id)),
          el("td", {}, j.status),
          el("td", {}, `${j.step ?? 0} / ${j.steps ?? "?"}`),
          el("td", {}, num(j.loss, 4)),
          el("td", {}, num(j.samples_per_s, 0)),
          el("td", {}, pct(j.data_wait_share)),
          el("td", {}, j.output),
          el("td", {}, j.last_checkpoint || "—"),
        ),
      ),
    );
  }

  // A rounds report's table (robotloop.ui.runs.rounds_rows): on its report's page and on its training run's.
  const interval = (ci) => (ci ? ` (${pct(ci[0])} to ${pct(ci[1])})` : "");
  // Scene by scene (robotloop.deploy.evaluate.Paired), from the first side's view: won, lost, sign test p.
  const versus = (v, who = "against stable") =>
    v ? `; ${who} ${v.won} won, ${v.lost} lost (p ${Number(v.p_value.toPrecision(2))})` : "";
  // Where a round's expert frames went (robotloop.ui.runs.EXPERT_PARTS), e.g. " (1916 takeovers, 12000 near misses)".
  const expertSplit = (split) => {
    const parts = Object.entries(split || {}).map(([part, n]) => `${n} ${part}`);
    return parts.length ? el("span", { class: "muted" }, ` (${parts.join(", ")})`) : "";
  };
  function showRounds(data) {
    $("#rounds-section").hidden = !data.rounds.length;
    const took = data.rounds_minutes === null ? "" : `; the rounds took ${num(data.rounds_minutes)} min`;
    const base = data.baseline_minutes ? ` (the baselines ${num(data.baseline_minutes)} min more)` : "";
    $("#rounds-stable").textContent = data.stable ? `stable runs ${data.stable}${took}${base}` : "";
    fill(
      "#rounds",
      data.rounds.map((r) => {
        const gain = r.gain_per_1000_expert_frames;
        const base = r.baseline;
        return el(
          "tr",
          { "data-round": r.round ?? "" },
          el("td", {}, r.round ?? "—"),
          el("td", {}, releaseLink(r.release)),
          el("td", { class: `decision-${(r.decision || "").replace(" ", "-")}` }, r.decision || "—"),
          el("td", {}, `${pct(r.success_rate)}${interval(r.ci95)}${versus(r.versus_stable)}`),
          el("td", {}, r.expert_frames ?? "—", expertSplit(r.expert_split)),
          el("td", {}, r.fleet_episodes === null ? "—" : `${r.fleet_episodes} (${r.fleet_failures ?? "?"})`),
          el("td", {}, r.takeovers == null ? "—" : `${r.takeovers}${r.branches ? ` + ${r.branches} branch drives` : ""}`),
          el("td", {}, num(r.minutes)),
          el("td", {}, gain === null ? "—" : `${gain >= 0 ? "+" : ""}${(100 * gain).toFixed(2)} pts`),
          el("td", {}, base ? `${pct(base.success_rate)}${interval(base.ci95)}, ${base.demos ?? "?"} demos${versus(base.versus_stable)}${versus(base.round_versus, "the round against it")}` : "—"),
        );
      }),
    );
  }

  const reportLinks = (found) => (found.length ? found.flatMap((r) => [link(`/reports/${enc(r.id)}`, r.run || r.id), " "]) : "none found");
  const run = { steps: [], losses: [], plot: null, last: -1, checkpointsAt: 0, reports: null };
  async function runPage() {
    const id = document.body.dataset.item;
    const data = await api(`/api/runs/${enc(id)}?after=${run.last}`);
    const j = data.job;
    if (run.reports === null && j.output) {
      run.reports = (await api(`/api/reports?run=${enc(j.output)}`)).reports; // once: the folders are searched
      const rounds = run.reports.find((r) => r.rounds > 0);
      if (rounds) showRounds(await api(`/api/reports/${enc(rounds.id)}`));
    }
    const facts = [
      ["status", `${j.status}${j.message ? `: ${j.message}` : ""}`],
      ["step", `${j.step ?? 0} of ${j.steps ?? "?"}`],
      ["loss", num(j.loss, 4)],
      ["samples/s", num(j.samples_per_s, 0)],
      ["data wait", pct(j.data_wait_share)],
      ["episodes in buffer", j.episodes ?? "—"],
      ["datasets", j.datasets.flatMap((d) => [datasetLink(d), " "])],
      ["output", j.output],
      ["loop report", reportLinks(run.reports || [])],
    ];
    $("#job-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    for (const p of data.points) {
      if (p.loss === null) continue;
      run.steps.push(p.step);
      run.losses.push(p.loss);
    }
    if (data.points.length) run.last = data.points[data.points.length - 1].step;
    $("#loss-points").textContent = String(run.steps.length);
    if (!run.plot && run.steps.length) {
      run.plot = new uPlot(
        { width: plotWidth("#loss-plot"), height: 260, scales: { x: { time: false } }, series: [{ label: "step" }, { label: "loss", stroke: "#4c72b0", width: 1.5 }] },
        [run.steps, run.losses],
        $("#loss-plot"),
      );
    } else if (run.plot && data.points.length) {
      run.plot.setData([run.steps, run.losses]);
    }
    state.lossPoints = run.plot ? run.plot.data[0].length : 0;
    if (j.output && Date.now() - run.checkpointsAt > 10000) {
      run.checkpointsAt = Date.now();
      const [found, made] = await Promise.all([api(`/api/checkpoints?output=${enc(j.output)}`), api("/api/releases").catch(() => ({ releases: [] }))]);
      const releasedAs = (url) => made.releases.filter((r) => r.checkpoint === url).map((r) => releaseLink(r.name));
      fill("#checkpoints", found.checkpoints.map((c) => row(c.step, c.url, el("td", {}, ...releasedAs(c.url)))));
    }
  }

  // -- datasets -------------------------------------------------------------------------------------------
  const player = { dataset: null, episode: null, plots: [] };
  async function datasets() {
    const params = new URLSearchParams(location.search);
    const url = params.get("url");
    const bucket = params.get("bucket") || (url ? url.split("/").slice(0, 5).join("/") : null);
    $("#bucket-form").onsubmit = (event) => {
      event.preventDefault();
      location.search = `?bucket=${enc($("#bucket").value.trim())}`;
    };
    api("/api/buckets")
      .then((b) => $("#buckets").replaceChildren(...b.buckets.map((u) => el("li", {}, link(`/datasets?bucket=${enc(u)}`, u)))))
      .catch((error) => say(error.message));
    if (bucket) {
      $("#bucket").value = bucket;
      api(`/api/datasets?bucket=${enc(bucket)}`) // beside the dataset itself, not before it
        .then((found) => $("#dataset-list").replaceChildren(...found.datasets.map((d) => el("li", {}, datasetLink(d)))))
        .catch((error) => error instanceof SignedOut || say(error.message));
    }
    if (url) await showDataset(url, params.get("episode"));
  }

  async function showDataset(url, selected) {
    const t0 = performance.now();
    const data = await api(`/api/dataset?url=${enc(url)}`);
    player.dataset = data;
    $("#dataset").hidden = false;
    $("#dataset-title").textContent = url;
    const frames = data.episodes.reduce((n, e) => n + e.length, 0);
    const fleet = data.role === "fleet";
    let facts = `${data.episodes.length} episodes, ${frames} frames at ${data.fps} fps; cameras ${data.video_keys.join(", ") || "none"}`;
    const shadows = Object.entries(data.shadow_maps || {});
    if (shadows.length) facts += `; filmed with ${shadows.map(([key, side]) => `${side === 0 ? "no shadows" : `${side}-texel shadow maps`} (${key})`).join(", ")}`;
    if (fleet) {
      const expert = data.episodes.reduce((n, e) => n + e.takeovers.reduce((m, [a, b]) => m + b - a, 0), 0);
      const robots = [...new Set(data.episodes.map((e) => e.fleet?.robot).filter((r) => r !== null && r !== undefined))];
      facts += `; a fleet dataset: ${expert} expert frames in ${data.episodes.reduce((n, e) => n + e.takeovers.length, 0)} takeovers, robots ${robots.join(", ") || "unknown"}`;
    }
    $("#dataset-facts").textContent = facts;
    const heads = ["episode", "frames", "task", "success", ...(fleet ? ["robot", "release", "kind", "expert frames", "takeovers"] : [])];
    $("#episodes thead").replaceChildren(el("tr", {}, ...heads.map((h) => el("th", {}, h))));
    const yesNo = (v) => (v === null || v === undefined ? "—" : v ? "yes" : "no");
    fill(
      "#episodes",
      data.episodes.map((e) =>
        el(
          "tr",
          { "data-episode": e.index, class: "clickable", onclick: () => playEpisode(e) },
          el("td", {}, el("button", { type: "button", class: "linkish" }, `episode ${e.index}`)),
          el("td", {}, e.length),
          el("td", {}, e.task),
          el("td", {}, yesNo(e.success)),
          ...(fleet
            ? [
                el("td", {}, e.fleet?.robot ?? "—"),
                el("td", {}, releaseLink(e.fleet?.release)),
                el("td", {}, e.fleet?.kind ?? "—"),
                el("td", {}, e.fleet?.expert_frames ?? e.takeovers.reduce((m, [a, b]) => m + b - a, 0)),
                el("td", {}, e.takeovers.length),
              ]
            : []),
        ),
      ),
    );
    state.datasetRenderMs = performance.now() - t0;
    state.renderedAt = performance.now(); // since the navigation started: what benchmarks/ui.py reports
    const chosen = data.episodes.find((e) => String(e.index) === String(selected));
    if (chosen) playEpisode(chosen);
  }

  function playEpisode(e) {
    const data = player.dataset;
    const key = data.video_keys[0];
    player.episode = e;
    state.clickedAt = performance.now();
    state.playingAt = null;
    history.replaceState(null, "", `/datasets?url=${enc(data.url)}&episode=${enc(e.index)}`);
    for (const tr of document.querySelectorAll("#episodes tr.selected")) tr.classList.remove("selected");
    document.querySelector(`#episodes tr[data-episode="${CSS.escape(String(e.index))}"]`)?.classList.add("selected");
    $("#player").hidden = false;
    $("#player-title").textContent = `Episode ${e.index}: ${e.task}`;
    if (key) {
      const segment = e.video[key];
      $("#segment").textContent = `${key}: ${segment.from_s.toFixed(2)} s to ${segment.to_s.toFixed(2)} s of a shared video file`;
      playSegment($("#video"), `/media/bucket?url=${enc(segment.url)}`, segment);
    }
    showTakeovers(e, data.fps, key ? e.video[key] : null);
    plotEpisode(data.url, e.index);
  }

  // A fleet episode's timeline: its frames end to end, the takeovers (frames the expert drove) marked; a click on
  // one plays the video from its first frame.
  function showTakeovers(e, fps, segment) {
    const fleet = Array.isArray(e.takeovers);
    $("#timeline").hidden = !fleet;
    $("#takeovers").hidden = !fleet;
    if (!fleet) return;
    const n = Math.max(1, e.length);
    const seek = (frame) => {
      if (!segment) return;
      const video = $("#video");
      video.currentTime = segment.from_s + frame / fps;
      video.play().catch((error) => say(`video: ${error.message}`));
    };
    const marks = e.takeovers.map(([start, end]) => {
      const mark = el("span", {
        class: "takeover",
        "data-start": start,
        "data-end": end,
        title: `expert: frames ${start} to ${end - 1}`,
        onclick: () => seek(start),
      });
      mark.style.left = `${(100 * start) / n}%`; // CSSOM, not a style attribute: the CSP allows no inline style
      mark.style.width = `${(100 * (end - start)) / n}%`;
      return mark;
    });
    $("#timeline").replaceChildren(...marks, $("#playhead"));
    const seconds = (frame) => (frame / fps).toFixed(2);
    $("#takeovers").textContent = e.takeovers.length
      ? `Takeovers (the expert drove): ${e.takeovers.map(([a, b]) => `frames ${a}–${b - 1} (${seconds(a)} s to ${seconds(b)} s)`).join(", ")}`
      : "No takeover: the policy drove every frame.";
  }

  // Episodes share mp4 files: seek to the episode's first frame, stop at its last.
  function playSegment(video, src, segment) {
    const start = () => {
      video.dataset.seeking = "1"; // frames of the old position may still arrive: not judged until 'seeked'
      video.currentTime = segment.from_s;
      video.play().catch((error) => say(`video: ${error.message}`));
    };
    video.dataset.from = segment.from_s;
    video.dataset.to = segment.to_s;
    if (video.getAttribute("src") !== src) {
      video.setAttribute("src", src);
      video.addEventListener("loadedmetadata", start, { once: true });
      video.load();
    } else {
      start();
    }
  }

  function watchSegment(video) {
    const check = (now, frame) => {
      const from = Number(video.dataset.from), to = Number(video.dataset.to);
      const t = frame ? frame.mediaTime : video.currentTime;
      if (video.dataset.seeking) {
        if (frame) video.requestVideoFrameCallback(check);
        return;
      }
      // Playing starts when a frame of the episode's own segment is shown after the click.
      if (frame && state.playingAt === null && !video.paused && t >= from - 0.01 && t < to) state.playingAt = performance.now();
      if (!video.paused && t >= to - 1e-3) {
        video.pause();
        video.currentTime = Math.max(from, to - 1e-3);
      }
      if (!video.paused && t < from - 0.05) video.currentTime = from; // a seek before the episode: back to it
      if (to > from) $("#playhead").style.left = `${(100 * Math.min(1, Math.max(0, (t - from) / (to - from))))}%`;
      if (frame) video.requestVideoFrameCallback(check); // one chain of frame callbacks; timeupdate is the backup
    };
    video.addEventListener("seeked", () => delete video.dataset.seeking);
    video.addEventListener("timeupdate", () => check(0, null));
    if (video.requestVideoFrameCallback) video.requestVideoFrameCallback(check);
  }

  async function plotEpisode(url, index) {
    const data = await api(`/api/episode?url=${enc(url)}&index=${enc(index)}`);
    if (player.episode?.index !== index) return; // another episode was chosen meanwhile
    for (const p of player.plots) p.destroy();
    player.plots = [
      ["#state-plot", "observation.state", data.state],
      ["#action-plot", "action", data.action],
    ].map(([where, name, values]) => linePlot(where, name, data.timestamp, values, data.names[name]));
    state.plottedEpisode = index;
  }

  const PALETTE = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd"];
  function linePlot(where, title, x, rows, names) {
    const dims = rows.length ? rows[0].length : 0;
    const series = [{ label: "s" }];
    const columns = [x];
    for (let d = 0; d < dims; d++) {
      series.push({ label: names?.[d] ? String(names[d]) : `${d}`, stroke: PALETTE[d % PALETTE.length], width: 1 });
      columns.push(rows.map((r) => r[d]));
    }
    return new uPlot({ title, width: plotWidth(where), height: 180, scales: { x: { time: false } }, legend: { show: dims <= 16 }, series }, columns, $(where));
  }

  const plotWidth = (where) => Math.max(320, Math.min(900, $(where).parentElement.clientWidth - 8));

  // -- reports --------------------------------------------------------------------------------------------
  async function reports() {
    const data = await api("/api/reports");
    fill("#reports", data.reports.map((r) => row(link(`/reports/${enc(r.id)}`, r.run || r.id), releaseLink(r.release), r.dir, when(r.modified))));
    fill(
      "#evaluation-list",
      data.evaluations.map((e) => row(e.checkpoint || e.policy, e.task, e.episodes, `${pct(e.success_rate)} (${pct(e.success_ci95?.[0])} to ${pct(e.success_ci95?.[1])})`)),
    );
  }

  async function report() {
    const data = await api(`/api/reports/${enc(document.body.dataset.item)}`);
    $("#report-dir").textContent = data.dir;
    showRounds(data);
    // Rendered on the server by markdown-it with html=False: raw HTML in the report arrives escaped.
    $("#report").innerHTML = data.html;
  }

  const pages = {
    fleet: { start: () => every(POLL_MS, fleet), refresh: fleet },
    releases: { start: () => every(5000, releases), refresh: releases },
    release: { start: () => every(5000, release), refresh: release },
    runs: { start: () => every(POLL_MS, runs) },
    run: { start: () => every(POLL_MS, runPage) },
    datasets: {
      start: () => {
        watchSegment($("#video"));
        return datasets().catch((error) => error instanceof SignedOut || say(error.message));
      },
    },
    reports: { start: () => every(10000, reports) },
    report: { start: () => report().catch((error) => error instanceof SignedOut || say(error.message)) },
  };

  // -- signing in -----------------------------------------------------------------------------------------
  function showLogin() {
    for (const t of state.timers.splice(0)) clearTimeout(t);
    $("#main").hidden = true;
    $("#logout").hidden = true;
    $("#who").textContent = "";
    $("#login").hidden = false;
    $("#token").focus();
  }

  function showPage(session) {
    state.write = session.write;
    $("#login").hidden = true;
    $("#main").hidden = false;
    $("#logout").hidden = false;
    $("#who").textContent = session.write ? "signed in (write)" : "signed in (read-only)";
    const name = document.body.dataset.page;
    document.querySelector(`nav a[data-nav="${name === "release" ? "releases" : name === "run" ? "runs" : name === "report" ? "reports" : name}"]`)?.classList.add("here");
    pages[name]?.start();
  }

  $("#login-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const field = $("#token");
    try {
      const session = await post("/api/session", { token: field.value });
      field.value = "";
      $("#login-error").textContent = "";
      showPage(session);
    } catch (error) {
      $("#login-error").textContent = error instanceof SignedOut ? "unknown token" : error.message;
    }
  });

  $("#logout").addEventListener("click", async () => {
    await api("/api/session", { method: "DELETE" }).catch(() => null);
    showLogin();
  });

  api("/api/session")
    .then(showPage)
    .catch((error) => error instanceof SignedOut || say(error.message));
})();
