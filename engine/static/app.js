// layerflow console: a small hand-written script, no framework, no build step.
//
// Every piece of data comes from the documented REST API of the same server, with the
// API token (asked once, kept in sessionStorage) as a bearer token. Text from the server
// is put into the page with textContent only; the one piece of markup, the diagram SVG,
// is built by the server with every value escaped and parsed here as an SVG document.
"use strict";

(function () {
  const TOKEN_KEY = "layerflow.token";
  const USER_KEY = "layerflow.user";
  const DRAFTS_KEY = "layerflow.drafts.";  // + instance id: what was typed there, kept across a reload
  const REFRESH_MS = 5000;
  const FINAL = ["completed", "cancelled"];  // statuses that never change again
  // The attention thresholds fire in one direction each (DESIGN.md "Compression").
  const FIRES_BELOW = { density: true, redundancy: false, decay: true, conflict: false, toolEfficiency: true };
  const LAYER_NAMES = ["SYSTEM", "PROCESS", "KNOWLEDGE", "HISTORY", "WORKING", "EPHEMERAL"];

  const $ = (id) => document.getElementById(id);
  const state = {
    timer: null, ticker: null, view: null, instanceId: null,
    doc: null, tape: [], context: "main", replay: null, drafts: {}, taskErrors: {}, loading: null, scrolledFor: null,
  };

  // ------------------------------------------------------------------ helpers

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  // Drafts (a decision's reason, a task's data) live in the tab's session storage, as the token
  // does: a reload, or a look at another instance and back, keeps what the approver typed.
  function loadDrafts(id) {
    try { return JSON.parse(sessionStorage.getItem(DRAFTS_KEY + id) || "{}") || {}; } catch (e) { return {}; }
  }

  function setDraft(key, value) {
    if (value === undefined) delete state.drafts[key]; else state.drafts[key] = value;
    if (!state.instanceId) return;
    if (Object.keys(state.drafts).length) sessionStorage.setItem(DRAFTS_KEY + state.instanceId, JSON.stringify(state.drafts));
    else sessionStorage.removeItem(DRAFTS_KEY + state.instanceId);
  }

  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }

  function json(value) {
    try { return JSON.stringify(value); } catch (e) { return String(value); }
  }

  function preview(value, limit) {
    const text = json(value);
    return text.length > limit ? text.slice(0, limit - 1) + "\u2026" : text;
  }

  function when(value) {
    if (!value) return "\u2014";
    const d = typeof value === "number" ? new Date(value * 1000) : new Date(value);
    if (isNaN(d)) return String(value);
    return d.toLocaleString(undefined, { year: "numeric", month: "short", day: "2-digit",
                                         hour: "2-digit", minute: "2-digit", second: "2-digit" });
  }

  function clock(seconds) {
    const d = new Date(seconds * 1000);
    return d.toLocaleTimeString(undefined, { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
  }

  function left(deadline) {
    if (!deadline) return "no deadline";
    let s = Math.round(deadline - Date.now() / 1000);
    if (s <= 0) return "time is up";
    const h = Math.floor(s / 3600); s -= h * 3600;
    const m = Math.floor(s / 60); s -= m * 60;
    return (h ? h + " h " : "") + (h || m ? m + " min " : "") + s + " s left";
  }

  function waitingText(list) {
    if (!list || !list.length) return "\u2014";
    return list.map((w) => (w.kind === "confirmation" ? "decision " + w.id
      : w.event ? w.event_kind + " " + w.event + " at " + w.task_id : "task " + (w.task_id || w.id))).join(", ");
  }

  function badge(status) {
    return el("span", { class: "badge status-" + (status || "unknown"), text: status || "unknown" });
  }

  function setState(node, text, kind) {
    node.textContent = text || "";
    node.className = "state" + (kind ? " " + kind : "");
    node.hidden = !text;
  }

  // ------------------------------------------------------------------ API

  class ApiError extends Error {
    constructor(status, kind, message) { super(message); this.status = status; this.kind = kind; }
  }

  async function api(path, options, token) {
    const opts = Object.assign({ method: "GET" }, options || {});
    const headers = { Accept: "application/json", Authorization: "Bearer " + (token || sessionStorage.getItem(TOKEN_KEY) || "") };
    if (opts.body !== undefined) { headers["Content-Type"] = "application/json"; opts.body = JSON.stringify(opts.body); }
    opts.headers = Object.assign(headers, opts.headers || {});
    let response;
    try {
      response = await fetch(path, opts);
    } catch (err) {
      throw new ApiError(0, "network", "Cannot reach the server (" + err.message + "). Is layerflow serve still running?");
    }
    if (response.status === 401 && !token) {
      signOut("The server no longer accepts your token. Sign in again.");
      throw new ApiError(401, "unauthorized", "signed out");
    }
    if (!response.ok) {
      let kind = "http_error", message = response.status + " " + response.statusText;
      try {
        const body = await response.json();
        if (body && body.error) { kind = body.error.kind; message = body.error.message; }
      } catch (e) { /* not JSON */ }
      throw new ApiError(response.status, kind, message);
    }
    const type = response.headers.get("content-type") || "";
    return type.includes("json") ? response.json() : response.text();
  }

  const enc = (s) => encodeURIComponent(s);

  // ------------------------------------------------------------------ session

  function signedIn() { return !!sessionStorage.getItem(TOKEN_KEY); }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    for (const key of Object.keys(sessionStorage)) if (key.startsWith(DRAFTS_KEY)) sessionStorage.removeItem(key);
    state.drafts = {};
    stopTimers();
    state.doc = null; state.tape = []; state.replay = null;
    for (const id of ["list-view", "instance-view"]) $(id).hidden = true;
    clear($("instances").tBodies[0]);
    clear($("conf-list")); clear($("diagram")); clear($("layer-tables")); clear($("tape-list"));
    showLogin(message);
  }

  function showLogin(message) {
    $("session").hidden = true;
    $("login").hidden = false;
    const error = $("login-error");
    error.textContent = message || "";
    error.hidden = !message;
    $("user").value = sessionStorage.getItem(USER_KEY) || $("user").value;
    document.title = "Sign in \u2014 layerflow console";
    ($("token").value ? $("login-submit") : $("token")).focus();
  }

  async function onLogin(event) {
    event.preventDefault();
    const token = $("token").value.trim();
    const user = $("user").value.trim();
    const error = $("login-error");
    if (!token || !user) {
      error.textContent = !token ? "Enter the API token." : "Enter your name: it is recorded with your answers.";
      error.hidden = false;
      (!token ? $("token") : $("user")).focus();
      return;
    }
    $("login-submit").disabled = true;
    error.hidden = true;
    try {
      await api("/api/instance-summaries?limit=1", {}, token);
    } catch (err) {
      error.textContent = err.status === 401
        ? "The server refused this token (401). Check it and try again."
        : "Could not sign in: " + err.message;
      error.hidden = false;
      $("token").select();
      $("token").focus();
      return;
    } finally {
      $("login-submit").disabled = false;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    sessionStorage.setItem(USER_KEY, user);
    $("token").value = "";
    $("login").hidden = true;
    route();
  }

  // ------------------------------------------------------------------ routing

  function stopTimers() {
    clearInterval(state.timer); state.timer = null;
    clearInterval(state.ticker); state.ticker = null;
  }

  function route() {
    stopTimers();
    if (!signedIn()) { showLogin(); return; }
    $("login").hidden = true;
    $("session").hidden = false;
    $("whoami").textContent = sessionStorage.getItem(USER_KEY) || "?";
    const match = location.hash.match(/^#\/instances\/([\w.:@-]+)$/);
    if (match) showInstance(match[1]); else showList();
  }

  // ------------------------------------------------------------------ the instances list

  function showList() {
    state.view = "list";
    $("instance-view").hidden = true;
    $("list-view").hidden = false;
    document.title = "Instances \u2014 layerflow console";
    loadList(true);
    state.timer = setInterval(() => { if ($("list-auto").checked) loadList(false); }, REFRESH_MS);
  }

  async function loadList(first) {
    const table = $("instances"), status = $("status-filter").value;
    if (first) { setState($("list-state"), "Loading instances\u2026", "loading"); table.setAttribute("aria-busy", "true"); }
    let rows;
    try {
      rows = await api("/api/instance-summaries" + (status ? "?status=" + enc(status) : ""));
    } catch (err) {
      if (err.status !== 401) setState($("list-state"), "Could not load the instances: " + err.message, "error");
      return;
    } finally {
      table.removeAttribute("aria-busy");
    }
    if (state.view !== "list") return;
    const body = clear(table.tBodies[0]);
    for (const r of rows) {
      body.append(el("tr", {},
        el("td", { "data-label": "Instance" }, el("a", { href: "#/instances/" + r.id, class: "mono" }, r.id)),
        el("td", { "data-label": "Process" }, r.process_id || "\u2014"),
        el("td", { "data-label": "Status" }, badge(r.status),
           r.open_conflicts ? el("span", { class: "tag conflict-tag", text: r.open_conflicts + " conflict" + (r.open_conflicts > 1 ? "s" : "") }) : null,
           r.dead_letter ? el("span", { class: "tag conflict-tag", text: "dead letter " + r.dead_letter, title: "no worker runs it until it is requeued (layerflow worker dead / requeue)" }) : null),
        el("td", { "data-label": "Started" }, el("time", { datetime: r.started || "" }, when(r.started))),
        el("td", { "data-label": "Waiting for" }, waitingText(r.waiting_for)),
        el("td", { "data-label": "Tokens", class: "num" }, r.tokens_total == null ? "\u2014" : String(r.tokens_total))));
    }
    table.hidden = rows.length === 0;
    if (!rows.length) {
      setState($("list-state"), status
        ? "No " + status + " instances. Choose another status, or \u201call\u201d."
        : "No instances yet. Start one through POST /api/instances (or `layerflow demo loan --store \u2026` on this server's store).",
        "empty");
    } else {
      setState($("list-state"), rows.length + " instance" + (rows.length > 1 ? "s" : "") + " \u00b7 updated " +
               new Date().toLocaleTimeString(), "quiet");
    }
  }

  // ------------------------------------------------------------------ one instance

  function showInstance(id) {
    if (state.instanceId !== id) {
      state.doc = null; state.tape = []; state.context = "main"; state.replay = null; state.drafts = loadDrafts(id);
      $("inst-body").hidden = true;
      // the last instance's cards would otherwise hand their drafts to this one's (same question ids)
      clear($("conf-list")); clear($("ut-list"));
    }
    state.view = "instance";
    state.instanceId = id;
    $("list-view").hidden = true;
    $("instance-view").hidden = false;
    $("inst-title").textContent = "Instance " + id;
    document.title = "Instance " + id + " \u2014 layerflow console";
    loadInstance(true);
    state.timer = setInterval(() => {
      if ($("inst-auto").checked && state.doc && !FINAL.includes(state.doc.status)) loadInstance(false);
    }, REFRESH_MS);
    state.ticker = setInterval(tick, 1000);
    $("main").focus();
  }

  async function loadInstance(force) {
    if (state.loading) {
      if (!force) return;
      // a forced load (after an answer, a refusal or a 409) must show what the server holds now,
      // not what a refresh that began before the answer fetched (its version is stale: a submit
      // carrying it would be refused): wait for that refresh, then load again
      await state.loading;
      return loadInstance(true);
    }
    state.loading = loadInstanceNow(force);
    try {
      await state.loading;
    } finally {
      state.loading = null;
    }
  }

  async function loadInstanceNow(force) {
    const id = state.instanceId;
    if (!state.doc) setState($("inst-state"), "Loading the instance\u2026", "loading");
    try {
      const doc = await api("/api/instances/" + enc(id));
      if (state.instanceId !== id) return;
      if (!force && state.doc && state.doc.version === doc.version && state.doc.status === doc.status) return;
      const [open, tape, inspect] = await Promise.all([
        api("/api/confirmations?instance_id=" + enc(id)),
        api("/api/instances/" + enc(id) + "/tape"),
        api("/api/context-governance/inspect", { method: "POST",
             body: { instance_id: id, context: state.context === "main" ? null : state.context,
                     metrics: ["token_count", "key_count"] } }).catch((err) => ({ error: err })),
      ]);
      if (state.instanceId !== id) return;
      state.doc = doc;
      state.tape = tape.events || [];
      renderHeader(doc);
      renderConfirmations(open);
      renderUserTasks(doc);
      renderContexts(doc);
      renderTapeFilters();
      renderTape();
      renderAttention(inspect);
      renderCompressions(doc);
      $("inst-body").hidden = false;
      setState($("inst-state"), "Updated " + new Date().toLocaleTimeString() +
               (FINAL.includes(doc.status) ? "" : " \u00b7 refreshes every " + REFRESH_MS / 1000 + " s"), "quiet");
      await Promise.all([loadDiagram(id), loadContext()]);
    } catch (err) {
      if (err.status === 401) return;
      const text = err.status === 404 ? "There is no instance " + id + " on this server." : "Could not load the instance: " + err.message;
      setState($("inst-state"), text, "error");
      if (!state.doc) $("inst-body").hidden = true;
    }
  }

  function renderHeader(doc) {
    const status = $("inst-status");
    status.className = "badge status-" + doc.status;
    status.textContent = doc.status;
    const facts = clear($("inst-facts"));
    const started = state.tape.length ? state.tape[0].time : null;
    const pairs = [
      ["Process", doc.process_id], ["Version", String(doc.version)], ["Started", when(started)],
      ["Waiting for", waitingText(doc.waiting_for)], ["Tokens (main)", String(doc.tokens.total)],
      ["Tape events", String(doc.tape_length)],
    ];
    if (doc.error) pairs.push(["Error", (doc.error.kind || "") + ": " + (doc.error.message || "")]);
    if (doc.cancelled) pairs.push(["Cancelled", "by " + doc.cancelled.by + ": " + doc.cancelled.reason]);
    for (const [k, v] of pairs) facts.append(el("div", {}, el("dt", { text: k }), el("dd", { text: v })));
  }

  // ----- confirmations

  function renderConfirmations(open) {
    const card = $("confirmations"), list = $("conf-list"), alert = $("decision-alert");
    alert.hidden = !open.length;
    $("decision-alert-text").textContent = open.length === 1
      ? "Waiting for a decision: " + (open[0].key ? open[0].key + " at " + (open[0].gateway_id || open[0].task_id) : open[0].id) + "."
      : open.length + " decisions are waiting.";
    // keep what someone is typing: drafts survive a refresh, and so does the focus on a decision
    for (const area of list.querySelectorAll("textarea")) setDraft(area.dataset.id, area.value);
    const active = document.activeElement;
    const focusedId = active && list.contains(active) && active.matches("textarea") ? active.dataset.id : null;
    clear(list);
    card.hidden = !open.length;
    open.forEach((c, n) => {
      const reasonId = "reason-" + n, errId = "conf-err-" + n;
      const reason = el("textarea", { id: reasonId, rows: 2, "data-id": c.id, required: true, maxlength: 2000,
                                      "aria-describedby": errId, oninput: () => setDraft(c.id, reason.value) });
      reason.value = state.drafts[c.id] || "";
      const error = el("p", { id: errId, class: "error", role: "alert", hidden: true });
      const options = el("div", { class: "options", role: "group", "aria-label": "Answer " + c.id });
      c.options.forEach((o) => {
        const suggested = c.suggested !== undefined && json(c.suggested) === json(o.value);
        options.append(el("button", { type: "button", class: "option" + (suggested ? " suggested" : ""),
          "data-value": json(o.value), onclick: () => answer(c, o, reason, error, options) },
          o.label, suggested ? el("span", { class: "tag", text: "suggested" }) : null));
      });
      const values = c.gateway_id ? conflictValues(c) : null;
      list.append(el("article", { class: "confirmation", "data-id": c.id, "aria-labelledby": "conf-h-" + n },
        el("h3", { id: "conf-h-" + n }, (c.type || "confirmation").replace(/_/g, " "), " ",
           el("code", { text: c.id })),
        el("p", { class: "message", text: c.message }),
        values,
        el("p", { class: "deadline" }, el("span", { class: "time-left", "data-deadline": c.deadline || "" }, left(c.deadline)),
           c.default !== undefined && c.default !== null ? " \u00b7 on timeout: " + preview(c.default, 60) : ""),
        el("label", { for: reasonId }, "Reason (recorded on the tape)"),
        reason, error, options));
      if (c.id === focusedId) reason.focus();
    });
  }

  function conflictValues(c) {
    const conflict = (state.doc.conflicts || []).find((x) => x.gateway_id === c.gateway_id && x.key === c.key);
    if (!conflict) return null;
    return el("dl", { class: "values" },
      Object.entries(conflict.values).map(([branch, v]) =>
        el("div", {}, el("dt", { text: branch }), el("dd", { class: "mono", text: preview(v, 120) }))),
      el("div", { class: "base" }, el("dt", { text: "at the split" }), conflict.base_absent
        ? el("dd", { class: "hint", text: "not set" }) : el("dd", { class: "mono", text: preview(conflict.base_value, 120) })));
  }

  async function answer(c, option, reason, error, group) {
    const text = reason.value.trim();
    if (!text) {
      error.textContent = "Give a reason first: it is recorded with your answer.";
      error.hidden = false;
      reason.focus();
      return;
    }
    error.hidden = true;
    for (const b of group.querySelectorAll("button")) b.disabled = true;
    try {
      const result = await api("/api/confirmations/" + c.id.split("/").map(enc).join("/"), { method: "POST",
        body: { value: option.value, reason: text, user: sessionStorage.getItem(USER_KEY) || "console",
                instance_id: state.instanceId, expected_version: state.doc ? state.doc.version : null } });
      setDraft(c.id, undefined);
      // said after the reload, which would otherwise replace it with "Updated ..." at once
      await loadInstance(true);
      setState($("inst-state"), "Answered " + c.id + " with " + preview(option.value, 60) + "; the instance is now " + result.status + ".", "ok");
      $("inst-state").focus();
    } catch (err) {
      if (err.status === 401) return;
      if (err.status !== 409) {
        error.textContent = "The answer was not accepted: " + err.message;
        error.hidden = false;
        for (const b of group.querySelectorAll("button")) b.disabled = false;
        return;
      }
      // the reload redraws (or, once it is decided, removes) this card: the message goes above it,
      // where it stays until the instance changes again
      setDraft(c.id, text);
      await loadInstance(true);
      setState($("inst-state"), err.kind === "already_answered"
        // decided meanwhile (by someone else, or by its timeout): final, nothing to answer again
        ? "Your answer to " + c.id + " was not recorded: the decision was already taken. " + err.message
        : "The instance changed while you were deciding (" + err.message + "). It has been reloaded: check it and answer again.",
        "error");
      $("inst-state").focus();
    }
  }

  // ----- user tasks: a person enters the task's data as a JSON object

  function renderUserTasks(doc) {
    const tasks = (doc.waiting_for || []).filter((w) => w.kind === "user_task");
    const list = $("ut-list");
    for (const area of list.querySelectorAll("textarea")) setDraft("task:" + area.dataset.id, area.value);
    clear(list);
    $("user-tasks").hidden = !tasks.length;
    tasks.forEach((t, n) => {
      const dataId = "ut-data-" + n, errId = "ut-err-" + n;
      const area = el("textarea", { id: dataId, rows: 3, "data-id": t.id, class: "mono", spellcheck: "false",
                                    "aria-describedby": errId, oninput: () => setDraft("task:" + t.id, area.value) });
      const fields = (t.form && t.form.fields) || [];
      // the form starts from what the context holds under a field's id (the preScript's value, an
      // earlier step's, SYSTEM's), else from the field's default, as the modeler's form would show it
      const start = {};
      for (const f of fields) {
        if (f.value !== undefined) start[f.id] = f.value;
        else if (f.default !== null && f.default !== undefined) start[f.id] = f.default;
      }
      area.value = state.drafts["task:" + t.id] || JSON.stringify(start);
      const controls = fields.map((f, i) => fieldControl(f, dataId + "-" + i, area, t));
      area.addEventListener("input", () => showData(area, controls));
      showData(area, controls);
      const error = el("p", { id: errId, class: "error", role: "alert", hidden: !state.taskErrors[t.id],
                              text: state.taskErrors[t.id] || null });
      delete state.taskErrors[t.id];
      const submit = el("button", { type: "button", class: "option", onclick: () => completeTask(t, area, error, submit) },
                        "Complete " + (t.name || t.task_id));
      list.append(el("article", { class: "confirmation user-task", "data-id": t.id, "aria-labelledby": "ut-h-" + n },
        el("h3", { id: "ut-h-" + n }, t.name || t.task_id, " ", el("code", { text: t.task_id })),
        t.documentation ? el("p", { class: "message", text: t.documentation }) : null,
        fields.length ? el("ul", { class: "form-fields", "aria-label": "Form fields (" + (t.form.source || "form") + ")" },
          ...fields.map((f, i) => el("li", { "data-field": f.id },
            el("label", { for: controls[i].id }, el("code", { text: f.id }), " ", f.label && f.label !== f.id ? f.label + " " : ""),
            "(" + [f.type, f.required ? "required" : "optional",
                   f.options ? "one of " + f.options.map(choice).join(", ") : null,
                   f.format ? "format " + f.format : null,
                   f.min !== undefined ? "min " + f.min : null, f.max !== undefined ? "max " + f.max : null,
                   f.default !== null && f.default !== undefined ? "default " + JSON.stringify(f.default) : null,
                   f.readonly ? "read-only: keep the value shown" : null]
              .filter(Boolean).join(", ") + ")",
            f.warning ? el("span", { class: "warning", text: " " + f.warning }) : null, " ", controls[i]))) : null,
        t.form && t.form.form_key ? el("p", { class: "message", text: "Form " + t.form.form_key + " (" + t.form.source + ")" }) : null,
        el("label", { for: dataId }, fields.length
          ? "All the data as JSON (the fields above fill it in; any other key goes to the task's WORKING layer too)"
          : "Data (a JSON object; its keys go to the task's WORKING layer)"),
        area, error, el("div", { class: "options" }, submit)));
    });
  }

  // A form field's control: a choice by name (an enum's options, yes/no), a number, a text. It
  // edits its key in the task's JSON data, which stays what is sent (and holds any other key).
  function fieldControl(f, id, area, t) {
    const type = String(f.type || "").toLowerCase();
    const numeric = ["long", "integer", "int", "double", "number", "float"].includes(type);
    let control;
    if ((f.options && f.options.length) || type === "boolean") {
      const options = f.options && f.options.length ? f.options : [{ id: true, name: "Yes" }, { id: false, name: "No" }];
      control = el("select", { id: id },
        el("option", { value: "", text: f.required ? "choose…" : "(none)" }),
        options.map((o) => el("option", { value: json(o.id),
                                          text: o.name === undefined || o.name === null || o.name === "" ? String(o.id) : String(o.name) })));
    } else {
      control = el("input", { id: id, type: numeric ? "number" : "text", step: numeric ? (type === "long" || type.startsWith("int") ? "1" : "any") : null,
                              min: numeric && f.min !== undefined ? f.min : null, max: numeric && f.max !== undefined ? f.max : null,
                              placeholder: f.format || null, required: f.required || null });
    }
    control.dataset.field = f.id;
    control.disabled = !!f.readonly;
    control.addEventListener(control.tagName === "SELECT" ? "change" : "input", () => {
      let data;
      try { data = JSON.parse(area.value || "{}"); } catch (e) { data = null; }
      if (data === null || typeof data !== "object" || Array.isArray(data)) return;  // Complete says what is wrong
      const raw = control.value;
      if (raw === "") delete data[f.id];
      else if (control.tagName === "SELECT") data[f.id] = JSON.parse(raw);
      else data[f.id] = numeric && !isNaN(Number(raw)) ? Number(raw) : raw;
      area.value = JSON.stringify(data);
      setDraft("task:" + t.id, area.value);
    });
    return control;
  }

  // the controls show what the JSON data holds (as it starts, a draft, what was typed there)
  function showData(area, controls) {
    let data;
    try { data = JSON.parse(area.value || "{}"); } catch (e) { return; }
    if (data === null || typeof data !== "object" || Array.isArray(data)) return;
    for (const control of controls) {
      if (document.activeElement === control) continue;
      const v = data[control.dataset.field];
      if (control.tagName === "SELECT") {
        const want = v === undefined ? "" : json(v);
        control.value = Array.from(control.options).some((o) => o.value === want) ? want : "";
      } else {
        control.value = v === undefined || v === null ? "" : typeof v === "string" ? v : json(v);
      }
    }
  }

  // an option as the answer takes it (its id, in JSON) and, when the modeler named it, by that name
  function choice(o) {
    const name = o.name === undefined || o.name === null ? "" : String(o.name);
    return JSON.stringify(o.id) + (name && name !== String(o.id) ? " (" + name + ")" : "");
  }

  async function completeTask(t, area, error, button) {
    let data;
    try { data = JSON.parse(area.value || "{}"); } catch (e) { data = undefined; }
    if (data === null || typeof data !== "object" || Array.isArray(data)) {
      error.textContent = "Enter a JSON object, e.g. {\"approved\": true}.";
      error.hidden = false;
      area.focus();
      return;
    }
    error.hidden = true;
    button.disabled = true;
    try {
      const result = await api("/api/instances/" + enc(state.instanceId) + "/user-tasks/" + enc(t.id), { method: "POST",
        body: { data: data, user: sessionStorage.getItem(USER_KEY) || "console",
                expected_version: state.doc ? state.doc.version : null } });
      setDraft("task:" + t.id, undefined);
      await loadInstance(true);  // first, as in answer(): its "Updated ..." would replace what is said
      setState($("inst-state"), "Completed " + (t.name || t.task_id) + "; the instance is now " + result.status + ".", "ok");
      $("inst-state").focus();
    } catch (err) {
      if (err.status === 401) return;
      error.textContent = err.status === 409
        ? "The instance changed meanwhile (" + err.message + "). It has been reloaded: check it and submit again."
        : "The data was not accepted: " + err.message;
      error.hidden = false;
      // A 409 and a refused answer (on the tape: a new version) reload the instance, keeping the
      // draft and the reason; the button stays disabled until then, or a second submit would
      // carry the version the server has already moved past (and be refused as stale)
      try {
        if (err.status === 409 || err.status === 400 || err.status === 403) {
          setDraft("task:" + t.id, area.value);
          state.taskErrors[t.id] = error.textContent;  // the reload redraws the card: say it there again
          await loadInstance(true);
          if (err.status === 409 && !(state.doc && (state.doc.waiting_for || []).some((w) => w.id === t.id))) {
            // done meanwhile (another approver, another tab): its card is gone, so say it above
            delete state.taskErrors[t.id];
            setDraft("task:" + t.id, undefined);
            setState($("inst-state"), "Your data for " + (t.name || t.task_id) + " was not recorded: the task no longer " +
                     "waits (done meanwhile; the instance is now " + (state.doc ? state.doc.status : "?") + "). " + err.message, "error");
            $("inst-state").focus();
          }
        }
      } finally {
        button.disabled = false;
      }
    }
  }

  function tick() {
    for (const node of document.querySelectorAll(".time-left[data-deadline]")) {
      const d = parseFloat(node.dataset.deadline);
      node.textContent = left(isNaN(d) ? null : d);
    }
  }

  // ----- diagram

  async function loadDiagram(id) {
    const box = $("diagram");
    try {
      const text = await api("/api/instances/" + enc(id) + "/diagram.svg", { headers: { Accept: "image/svg+xml" } });
      const parsed = new DOMParser().parseFromString(text, "image/svg+xml");
      const svg = parsed.documentElement;
      if (svg.nodeName !== "svg") throw new Error("the server sent no SVG");
      // fit the width of the page down to 3/4 of the drawn size; below that, scroll sideways
      const width = parseFloat(svg.getAttribute("width")) || 800;
      svg.removeAttribute("width");
      svg.removeAttribute("height");
      const shown = document.importNode(svg, true);
      shown.style.maxWidth = width + "px";
      shown.style.minWidth = Math.round(0.75 * width) + "px";
      clear(box).append(shown);
      // on a narrow screen, bring what needs attention into view once (then the reader scrolls)
      const spot = shown.querySelector(".node.conflict, .node.state-failed, .node.state-current");
      if (spot && state.scrolledFor !== id && box.scrollWidth > box.clientWidth) {
        const r = spot.getBoundingClientRect(), b = box.getBoundingClientRect();
        box.scrollLeft += r.left + r.width / 2 - (b.left + b.width / 2);
      }
      state.scrolledFor = id;
    } catch (err) {
      if (err.status === 401) return;
      clear(box).append(el("p", { class: "state error", text: "Could not draw the diagram: " + err.message }));
    }
    const conflicts = clear($("conflicts"));
    for (const c of state.doc.conflicts || []) {
      const res = c.resolution;
      conflicts.append(el("p", { class: "conflict-line" + (res ? " resolved" : "") },
        el("strong", { text: (res ? "Resolved conflict" : "Conflict") + " at " + c.gateway_id + " on " + c.key + ": " }),
        Object.entries(c.values).map(([b, v]) => b + " = " + preview(v, 60)).join(" \u00b7 "),
        res ? " \u2192 " + preview(res.value, 60) + " (" + res.resolver + (res.reason ? ": " + res.reason : "") + ")" : ""));
    }
  }

  // ----- context layers (current, or replayed at a sequence number)

  function renderContexts(doc) {
    const select = $("context-select");
    const names = ["main"].concat(Object.keys(doc.contexts || {}));
    if (!names.includes(state.context)) state.context = "main";
    clear(select);
    for (const name of names) {
      const info = (doc.contexts || {})[name];
      select.append(el("option", { value: name, selected: name === state.context },
        info ? name + " (" + info.status + ")" : "main"));
    }
  }

  async function loadContext() {
    const id = state.instanceId;
    const r = state.replay;
    const context = r ? r.context : state.context;
    let url = "/api/instances/" + enc(id) + "/replay?context=" + enc(context);
    if (r) url += "&until=" + r.seq;
    try {
      const data = await api(url);
      // a load begun before a tape event was picked (or the replay closed) must not paint over it
      if (state.instanceId !== id || state.replay !== r || (!r && state.context !== context)) return;
      renderLayers(data);
    } catch (err) {
      if (err.status === 401 || state.replay !== r) return;
      clear($("layer-tables")).append(el("p", { class: "state error", text: "Could not load the context: " + err.message }));
    }
  }

  function renderLayers(data) {
    const banner = $("replay-banner");
    if (state.replay) {
      const e = data.event || {};
      $("replay-text").textContent = "Context " + data.context + " as it was after #" + data.until + " (" +
        eventKind(e) + (e.activity ? " by " + e.activity : e.actor ? " by " + e.actor : "") + "), rebuilt from the tape.";
      banner.hidden = false;
    } else {
      banner.hidden = true;
    }
    const bars = clear($("layer-bars"));
    const max = Math.max(1, ...Object.values(data.layers).map((l) => l.tokens));
    Object.entries(data.layers).forEach(([code, layer], i) => {
      const fill = el("span", { class: "fill layer-" + i });
      fill.style.width = (100 * layer.tokens / max).toFixed(1) + "%";
      bars.append(el("div", { class: "bar-row" },
        el("span", { class: "bar-label" }, el("strong", { text: code }), " " + (layer.name || LAYER_NAMES[i])),
        el("span", { class: "track", role: "img", "aria-label": code + ": " + layer.tokens + " tokens" }, fill),
        el("span", { class: "bar-value", text: layer.tokens + " tok \u00b7 " + layer.keys.length + " key" + (layer.keys.length === 1 ? "" : "s") })));
    });
    const tables = clear($("layer-tables"));
    Object.entries(data.layers).forEach(([code, layer], i) => {
      const details = el("details", { class: "layer", open: layer.keys.length > 0 && i !== 2 && i !== 0 },
        el("summary", {}, el("strong", { text: code + " " + (layer.name || LAYER_NAMES[i]) }),
           " \u00b7 " + layer.keys.length + " keys \u00b7 " + layer.tokens + " tokens"));
      if (!layer.keys.length) {
        details.append(el("p", { class: "hint", text: "No keys in this layer." }));
      } else {
        const body = el("tbody");
        for (const k of layer.keys) {
          const w = k.written_by;
          const by = w ? (w.activity || w.actor) : "\u2014";
          const where = w ? "#" + w.seq + (w.context !== data.context ? " in " + w.context : "") + " \u00b7 " + w.kind : "";
          body.append(el("tr", {},
            el("th", { scope: "row", class: "mono key" }, k.key, k.preserved ? el("span", { class: "tag", text: "preserved" }) : null),
            el("td", { class: "mono value", title: preview(k.value, 2000) }, preview(k.value, 64)),
            el("td", { class: "num" }, String(k.tokens)),
            el("td", {}, el("span", { text: by }), where ? el("span", { class: "hint block", text: where }) : null)));
        }
        details.append(el("div", { class: "table-wrap" }, el("table", { class: "keys" },
          el("caption", { class: "sr-only", text: code + " keys" }),
          el("thead", {}, el("tr", {}, el("th", { scope: "col", text: "Key" }), el("th", { scope: "col", text: "Value" }),
             el("th", { scope: "col", class: "num", text: "Tokens" }), el("th", { scope: "col", text: "Written by" }))),
          body)));
      }
      tables.append(details);
    });
  }

  // ----- tape

  function eventKind(e) {
    return e.kind === "note" && e.data && e.data.note ? e.data.note : e.kind;
  }

  function eventKeys(e) {
    const keys = (e.changes || []).map((c) => c[1]);
    if (e.data && typeof e.data.key === "string") keys.push(e.data.key);
    return keys;
  }

  function fillSelect(select, values, label) {
    const current = select.value;
    clear(select).append(el("option", { value: "", text: label }));
    for (const v of values) select.append(el("option", { value: v, text: v === "\u0000main" ? "main line" : v }));
    select.value = values.includes(current) ? current : "";
  }

  function renderTapeFilters() {
    const uniq = (f) => Array.from(new Set(state.tape.map(f).filter((x) => x))).sort();
    fillSelect($("f-kind"), uniq(eventKind), "any kind");
    fillSelect($("f-activity"), uniq((e) => e.activity), "any activity");
    fillSelect($("f-branch"), ["\u0000main"].concat(uniq((e) => e.branch)), "any branch");
  }

  function describe(e) {
    const d = e.data || {};
    const changes = e.changes || [];
    if (eventKind(e) === "human_decision") {
      return "answered " + (d.confirmation_id || "") + " with " + preview(d.value, 60) + (d.reason ? " \u2014 " + d.reason : "");
    }
    if (changes.length) {
      const shown = changes.slice(0, 3).map((c) => "L" + c[0] + " " + c[1] + (c.length > 2 ? " = " + preview(c[2], 40) : " removed"));
      return shown.join("; ") + (changes.length > 3 ? " (+" + (changes.length - 3) + " more)" : "");
    }
    if (d.key && d.conflicting_values) return d.key + ": " + Object.entries(d.conflicting_values).map(([b, v]) => b + " = " + preview(v, 30)).join(", ");
    if (d.detail) return String(d.detail);
    if (d.message) return preview(d.message, 120).replace(/^"|"$/g, "");
    return "";
  }

  function renderTape() {
    const kind = $("f-kind").value, activity = $("f-activity").value, branch = $("f-branch").value;
    const key = $("f-key").value.trim().toLowerCase();
    const list = clear($("tape-list"));
    const shown = state.tape.filter((e) =>
      (!kind || eventKind(e) === kind) && (!activity || e.activity === activity) &&
      (!branch || (branch === "\u0000main" ? !e.branch : e.branch === branch)) &&
      (!key || eventKeys(e).some((k) => k.toLowerCase().includes(key))));
    if ($("f-newest").checked) shown.reverse();
    for (const e of shown) {
      const selected = state.replay && state.replay.context === e.context && state.replay.seq === e.seq;
      const label = eventKind(e);
      list.append(el("li", { class: "event kind-" + label.replace(/[^\w-]/g, "") },
        el("button", { type: "button", "aria-pressed": selected ? "true" : "false",
                       "data-context": e.context, "data-seq": e.seq,
                       onclick: () => selectEvent(e) },
          el("span", { class: "seq mono", text: "#" + e.seq }),
          el("span", { class: "kind", text: label }),
          el("span", { class: "who" }, [e.activity || e.actor, e.branch ? "branch " + e.branch : null, e.actor && e.activity && e.actor !== e.activity ? "by " + e.actor : null].filter(Boolean).join(" \u00b7 ")),
          el("time", { class: "at mono", text: clock(e.time) }),
          el("span", { class: "what", text: describe(e) }))));
    }
    $("tape-count").textContent = "Showing " + shown.length + " of " + state.tape.length + " events" +
      (shown.length < state.tape.length ? " (filtered)" : "") + ".";
    if (!shown.length) list.append(el("li", { class: "hint", text: state.tape.length ? "No event matches these filters." : "The tape is empty." }));
  }

  function selectEvent(e) {
    state.replay = { context: e.context, seq: e.seq };
    for (const b of $("tape-list").querySelectorAll("button[aria-pressed]")) {
      b.setAttribute("aria-pressed", b.dataset.context === e.context && Number(b.dataset.seq) === e.seq ? "true" : "false");
    }
    loadContext().then(() => {
      const card = $("layers-card").getBoundingClientRect();
      if (card.top < 0 || card.top > window.innerHeight) $("replay-banner").scrollIntoView({ block: "nearest" });
    });
  }

  // ----- attention and compressions

  function renderAttention(inspect) {
    const box = clear($("attention"));
    if (!inspect || inspect.error) {
      box.append(el("p", { class: "state error", text: "Could not compute the attention scores: " + (inspect && inspect.error ? inspect.error.message : "no answer") }));
      return;
    }
    const scores = inspect.attention || {};
    const limits = (inspect.compress_status || {}).thresholds || {};
    const firing = new Set(((inspect.compress_status || {}).would_trigger) || []);
    box.append(el("p", { class: "hint", text: "HISTORY + WORKING of context " + inspect.context + ". A score past its threshold triggers compression." }));
    const list = el("ul", { class: "scores" });
    for (const name of Object.keys(FIRES_BELOW)) {
      const value = scores[name], limit = limits[name];
      if (value === undefined) continue;
      const fires = firing.has(name) || (limit !== null && limit !== undefined && (FIRES_BELOW[name] ? value < limit : value > limit));
      const fill = el("span", { class: "fill" + (fires ? " fires" : "") });
      fill.style.width = (100 * Math.max(0, Math.min(1, value))).toFixed(1) + "%";
      const mark = el("span", { class: "limit" });
      if (limit !== null && limit !== undefined) mark.style.left = (100 * limit).toFixed(1) + "%";
      const rule = limit === null || limit === undefined ? "no threshold" : (FIRES_BELOW[name] ? "fires below " : "fires above ") + limit;
      list.append(el("li", { class: fires ? "fires" : "" },
        el("span", { class: "score-name", text: name }),
        el("span", { class: "track", role: "img", "aria-label": name + " " + value.toFixed(2) + ", " + rule }, fill, limit !== null && limit !== undefined ? mark : null),
        el("span", { class: "score-value mono", text: value.toFixed(2) }),
        el("span", { class: "score-rule", text: rule + (fires ? " \u2014 fires" : " \u2014 ok") })));
    }
    box.append(list);
    const explain = (inspect.compress_status || {}).explain;
    if (explain) box.append(el("p", { class: "hint", text: "Would trigger: " + explain }));
  }

  function renderCompressions(doc) {
    const box = clear($("compressions"));
    const list = doc.compressions || [];
    if (!list.length) {
      box.append(el("p", { class: "state empty", text: "No compressions on this instance yet." }));
      return;
    }
    const total = (t) => (typeof t === "number" ? t : t && typeof t === "object"
      ? (t.total !== undefined ? t.total : Object.values(t).reduce((a, b) => a + (Number(b) || 0), 0)) : 0);
    const items = el("ol", { class: "compressions" });
    for (const c of list) {
      const before = total(c.tokens_before), after = total(c.tokens_after);
      const was = el("span", { class: "fill before" }), now = el("span", { class: "fill after" });
      was.style.width = "100%";
      now.style.width = (before ? (100 * after / before) : 0).toFixed(1) + "%";
      items.append(el("li", {},
        el("p", {}, el("strong", { text: c.activity_id || "governance" }),
           " \u00b7 triggers: " + ((c.triggers || []).join(", ") || "\u2014")),
        el("span", { class: "track", role: "img", "aria-label": "before: " + before + " tokens" }, was),
        el("span", { class: "track", role: "img", "aria-label": "after: " + after + " tokens" }, now),
        el("p", { class: "hint" }, before + " \u2192 " + after + " tokens" +
           (before ? " (\u2212" + Math.round(100 * (1 - after / before)) + "%)" : ""),
           c.undone ? el("span", { text: " \u00b7 undone by " + c.undone.by + " (event " + c.undone.seq +
                                         (c.undone.context ? " of " + c.undone.context : "") + ")" })
             : c.snapshot_id ? el("span", {}, " \u00b7 undo snapshot ", el("code", { text: c.snapshot_id })) : null)));
    }
    box.append(items);
  }

  // ------------------------------------------------------------------ wiring

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", onLogin);
    $("signout").addEventListener("click", () => signOut("Signed out."));
    $("status-filter").addEventListener("change", () => loadList(true));
    $("list-refresh").addEventListener("click", () => loadList(true));
    $("inst-refresh").addEventListener("click", () => loadInstance(true));
    $("context-select").addEventListener("change", (ev) => { state.context = ev.target.value; state.replay = null; loadInstance(true); });
    $("replay-exit").addEventListener("click", () => {
      state.replay = null;
      for (const b of $("tape-list").querySelectorAll("button[aria-pressed='true']")) b.setAttribute("aria-pressed", "false");
      loadContext();
    });
    for (const id of ["f-kind", "f-activity", "f-branch", "f-newest"]) $(id).addEventListener("change", renderTape);
    $("f-key").addEventListener("input", renderTape);
    $("tape-filters").addEventListener("submit", (ev) => ev.preventDefault());
    // The hash is the route (#/instances/ID): a link to a part of the page ("Skip to content",
    // "Answer it below") must move the focus there, not change the hash, which would leave the page.
    document.addEventListener("click", (ev) => {
      const link = ev.target instanceof Element ? ev.target.closest("a[href^='#']") : null;
      const href = link ? link.getAttribute("href") : "";
      if (!href || href === "#" || href.startsWith("#/")) return;
      const target = document.getElementById(href.slice(1));
      if (!target) return;
      ev.preventDefault();
      const field = target.matches("a, button, input, textarea, select, [tabindex]") ? target
        : target.querySelector("textarea, input, select, button, a[href]");
      if (!field && !target.hasAttribute("tabindex")) target.setAttribute("tabindex", "-1");
      (field || target).focus();
      target.scrollIntoView({ block: "start" });
    });
    window.addEventListener("hashchange", route);
    route();
  });
})();
