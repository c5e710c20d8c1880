// The web page of `wma serve`: pick an agent (those where requests start
// first, each with its model), load another of the config's models into
// its provider, talk to it, watch its parts (and its sub-agents') stream
// in, answer the calls that wait for approval, reopen past conversations.
//
// Everything that comes from the server (a model's text, a tool's output,
// a page's content, a session's title) is data: it goes into the page with
// textContent, never as markup. The token is kept in sessionStorage (this
// tab only) and sent as `Authorization: Bearer` with every call; this is
// why the run's events are read with fetch() and not EventSource, which
// cannot send a header.
'use strict';

(() => {
  const TOKEN_KEY = 'wma.token';
  // The conversation on screen and the run being followed, so that a
  // reload shows the same parts and reconnects to a run still going.
  const VIEW_KEY = 'wma.view';
  // How often the list of waiting calls is read while nothing else asks
  // for it (calls of runs this tab does not follow, or of a restart).
  const APPROVALS_POLL_MS = 5000;
  // How long to wait before reading a run's events again after its stream
  // broke off.
  const RECONNECT_MS = 1000;

  const $ = (id) => document.getElementById(id);

  const state = {
    token: null,
    // The hosted agents, those where requests start (`top_level`) first.
    agents: [],
    // The config's providers: what `PUT /v1/agents/{agent}/provider` loads.
    providers: [],
    // A swap is loading: the controls wait for it.
    swapping: false,
    // { agent, session, title, items: [...], run: { id, agent, lastId } | null }
    view: null,
    // Aborts the stream being read.
    reading: null,
    pollTimer: null,
    // Ends the wait before the run's events are read again.
    wake: null,
  };

  // -------------------------------------------------------------------
  // Small DOM helpers (text only)

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  function pretty(value) {
    if (typeof value === 'string') {
      // A tool's output is often JSON in a string: show it indented.
      try {
        return JSON.stringify(JSON.parse(value), null, 2);
      } catch (_) {
        return value;
      }
    }
    return JSON.stringify(value, null, 2);
  }

  function setStatus(text, isError) {
    const status = $('status');
    status.textContent = text || '';
    status.classList.toggle('error', Boolean(isError));
  }

  // -------------------------------------------------------------------
  // The API

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function errorOf(response) {
    try {
      const body = await response.json();
      if (body && typeof body.error === 'string') return body.error;
    } catch (_) {
      // Not JSON: the status line says enough.
    }
    return `${response.status} ${response.statusText}`;
  }

  // One call with the token. A 401 means the token is not (or no longer)
  // this server's: the page forgets it and asks again.
  async function call(method, path, body, headers) {
    const init = {
      method,
      headers: Object.assign({ Authorization: `Bearer ${state.token}` }, headers || {}),
      cache: 'no-store',
    };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    if (response.status === 401) {
      const message = await errorOf(response);
      askForToken(message);
      throw new ApiError(401, message);
    }
    return response;
  }

  async function callJson(method, path, body) {
    const response = await call(method, path, body);
    if (!response.ok) throw new ApiError(response.status, await errorOf(response));
    return response.json();
  }

  // Reads a `text/event-stream` body and calls `onEvent({id, event, data})`
  // for each event, as the SSE format defines them: lines ending in CR, LF
  // or CRLF, `field: value`, a blank line ends an event, `:` a comment.
  async function readEvents(response, onEvent, signal) {
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    const abort = () => reader.cancel().catch(() => {});
    signal.addEventListener('abort', abort);
    let buffer = '';
    let event = { id: null, event: 'message', data: [] };
    const line = (text) => {
      if (text === '') {
        if (event.data.length > 0) {
          onEvent({ id: event.id, event: event.event, data: event.data.join('\n') });
        }
        event = { id: null, event: 'message', data: [] };
        return;
      }
      if (text.startsWith(':')) return;
      const colon = text.indexOf(':');
      const field = colon < 0 ? text : text.slice(0, colon);
      let value = colon < 0 ? '' : text.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'data') event.data.push(value);
      else if (field === 'event') event.event = value;
      else if (field === 'id') event.id = value;
    };
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let match;
        // A lone CR at the end may be half of a CRLF: wait for more.
        while ((match = /\r\n|\n|\r(?=[^\n])/.exec(buffer)) !== null) {
          line(buffer.slice(0, match.index));
          buffer = buffer.slice(match.index + match[0].length);
        }
      }
    } finally {
      signal.removeEventListener('abort', abort);
    }
  }

  // -------------------------------------------------------------------
  // The token

  function tokenFromFragment() {
    const fragment = location.hash.startsWith('#') ? location.hash.slice(1) : '';
    const token = new URLSearchParams(fragment).get('token');
    if (token) {
      // Out of the address bar and the tab's history, so that it is not
      // copied with the address.
      history.replaceState(null, '', location.pathname + location.search);
    }
    return token;
  }

  function askForToken(message) {
    stopReading();
    stopPolling();
    state.token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    $('app').hidden = true;
    $('agent-label').hidden = true;
    $('provider-label').hidden = true;
    $('swap').hidden = true;
    $('new-session').hidden = true;
    $('forget-token').hidden = true;
    $('token-panel').hidden = false;
    $('token-error').textContent = message || '';
    $('token-input').value = '';
    $('token-input').focus();
  }

  async function useToken(token) {
    state.token = token;
    sessionStorage.setItem(TOKEN_KEY, token);
    $('token-error').textContent = '';
    try {
      await readAgents();
    } catch (e) {
      if (e.status !== 401) askForToken(`The server did not answer: ${e.message}`);
      return;
    }
    $('token-panel').hidden = true;
    $('app').hidden = false;
    $('agent-label').hidden = false;
    $('provider-label').hidden = state.providers.length === 0;
    $('swap').hidden = state.providers.length === 0;
    $('new-session').hidden = false;
    $('forget-token').hidden = false;
    showAgents();
    restoreView();
    refreshSessions();
    refreshApprovals();
    startPolling();
  }

  // -------------------------------------------------------------------
  // Agents

  // Reads the agents and the config's providers. The agents where
  // requests start come first (the server lists them so; kept here for a
  // server that does not), each group in the server's order.
  async function readAgents() {
    const answer = await callJson('GET', '/v1/agents');
    const agents = (answer.agents || []).filter((a) => !a.remote);
    state.agents = agents.filter((a) => a.top_level).concat(agents.filter((a) => !a.top_level));
    state.providers = answer.providers || [];
  }

  // The agent to show first: the first one where requests start.
  function firstAgent() {
    const first = state.agents.find((a) => a.top_level) || state.agents[0];
    return first ? first.name : null;
  }

  // The model an agent runs on, as the page names it.
  function modelOf(agent) {
    return agent.model || agent.provider || '';
  }

  function showAgents() {
    const select = $('agent');
    const chosen = select.value;
    clear(select);
    const groups = [
      ['Agents', state.agents.filter((a) => a.top_level)],
      ['Sub-agents', state.agents.filter((a) => !a.top_level)],
    ];
    for (const [label, agents] of groups) {
      if (agents.length === 0) continue;
      const group = el('optgroup');
      group.label = label;
      for (const agent of agents) {
        const option = el('option', null, `${agent.name} · ${modelOf(agent)}`);
        option.value = agent.name;
        option.dataset.model = modelOf(agent);
        group.appendChild(option);
      }
      select.appendChild(group);
    }
    if (chosen && agentNamed(chosen)) select.value = chosen;
    const providers = $('provider');
    clear(providers);
    for (const p of state.providers) {
      const model = p.model || 'the default model';
      const option = el('option', null, `${p.name} · ${model} (${p.kind})`);
      option.value = p.name;
      providers.appendChild(option);
    }
    if (state.agents.length === 0) {
      setStatus('This server hosts no agent.', true);
    }
  }

  function agentNamed(name) {
    return state.agents.find((a) => a.name === name) || null;
  }

  function showAgent(name) {
    $('agent').value = name;
    const agent = agentNamed(name);
    $('agent-description').textContent = agent && agent.description ? agent.description : '';
    $('agent-model').textContent = agent
      ? `Model: ${modelOf(agent)} (provider ${agent.provider}, ${agent.provider_kind})`
      : '';
    if (agent && state.providers.some((p) => p.name === agent.loaded)) {
      $('provider').value = agent.loaded;
    }
    updateSwap();
  }

  // The Load button is for another provider than the one loaded.
  function updateSwap() {
    const agent = agentNamed($('agent').value);
    const wanted = $('provider').value;
    $('provider').disabled = state.swapping || !agent;
    $('swap').disabled = state.swapping || !agent || !wanted || wanted === agent.loaded;
  }

  // Loads the chosen provider's model into the agent's provider, through
  // `PUT /v1/agents/{agent}/provider`; every agent on that provider runs
  // on it from the next step on.
  async function swap() {
    const agent = agentNamed($('agent').value);
    const wanted = $('provider').value;
    if (!agent || !wanted) return;
    state.swapping = true;
    updateSwap();
    setStatus(`Loading ${wanted} into ${agent.provider}…`);
    try {
      const reply = await callJson(
        'PUT',
        `/v1/agents/${encodeURIComponent(agent.name)}/provider`,
        { provider: wanted },
      );
      await readAgents();
      showAgents();
      const agents = (reply.agents || [agent.name]).join(', ');
      setStatus(`Loaded ${reply.loaded} (${reply.model}) for ${agents}.`);
    } catch (e) {
      if (e.status !== 401) setStatus(`The model did not load: ${e.message}`, true);
    } finally {
      state.swapping = false;
      const shown = agentNamed($('agent').value);
      if (shown) showAgent(shown.name);
      else updateSwap();
    }
  }

  // -------------------------------------------------------------------
  // The view: what the transcript shows, kept for a reload

  function newView(agent) {
    return { agent, session: null, title: null, items: [], run: null };
  }

  // Keeps the view in sessionStorage. When it does not fit, the run's
  // parts are left out and a reload reads them all again from the log.
  function saveView() {
    const view = state.view;
    if (!view) {
      sessionStorage.removeItem(VIEW_KEY);
      return;
    }
    try {
      sessionStorage.setItem(VIEW_KEY, JSON.stringify(view));
    } catch (_) {
      const runId = view.run ? view.run.id : null;
      const lean = Object.assign({}, view, {
        items: view.items.filter((i) => !(i.kind === 'part' && i.run === runId)),
        run: view.run ? Object.assign({}, view.run, { lastId: 0 }) : null,
      });
      try {
        sessionStorage.setItem(VIEW_KEY, JSON.stringify(lean));
      } catch (_) {
        sessionStorage.removeItem(VIEW_KEY);
      }
    }
  }

  function restoreView() {
    let view = null;
    try {
      view = JSON.parse(sessionStorage.getItem(VIEW_KEY) || 'null');
    } catch (_) {
      view = null;
    }
    if (!view || !agentNamed(view.agent)) {
      showView(newView(firstAgent()));
      return;
    }
    showView(view);
    if (view.run) follow(view.run, null);
  }

  function showView(view) {
    stopReading();
    state.view = view;
    if (view.agent) showAgent(view.agent);
    $('session-title').textContent = view.title || 'New conversation';
    const transcript = $('transcript');
    clear(transcript);
    for (const item of view.items) transcript.appendChild(renderItem(item));
    transcript.scrollTop = transcript.scrollHeight;
    setRunning(Boolean(view.run));
    highlightSession();
    saveView();
  }

  function addItem(item) {
    state.view.items.push(item);
    const transcript = $('transcript');
    const stick = transcript.scrollHeight - transcript.scrollTop - transcript.clientHeight < 40;
    transcript.appendChild(renderItem(item));
    if (stick) transcript.scrollTop = transcript.scrollHeight;
  }

  function setRunning(running) {
    $('send').disabled = running;
    $('stop').disabled = !running;
    $('agent').disabled = running;
  }

  // -------------------------------------------------------------------
  // Rendering (text only)

  function renderItem(item) {
    if (item.kind === 'user') {
      const node = el('div', 'msg user');
      node.appendChild(el('div', 'who', 'you'));
      node.appendChild(el('div', 'text', item.text));
      return node;
    }
    if (item.kind === 'part') return renderPart(item.part, item.seq);
    if (item.kind === 'note') return el('div', 'note', item.text);
    return el('div', 'note', '');
  }

  function head(node, label, name) {
    const line = el('div', 'head');
    line.appendChild(el('span', 'label', label));
    if (name) line.appendChild(el('span', 'name', name));
    node.appendChild(line);
    return line;
  }

  function renderPart(part, seq) {
    const type = String(part.type || 'unknown');
    const depth = Number(part.depth) || 0;
    const node = el('div', `part ${type} depth-${Math.min(depth, 3)}`);
    node.dataset.type = type;
    if (seq !== null && seq !== undefined) node.dataset.seq = String(seq);
    if (part.agent) node.dataset.agent = String(part.agent);
    node.dataset.depth = String(depth);
    if (depth > 0 && part.agent) node.appendChild(el('div', 'agent', part.agent));
    switch (type) {
      case 'message-start':
        node.appendChild(el('span', 'label', `step ${part.step}`));
        break;
      case 'text':
        node.appendChild(el('div', 'text', part.text));
        break;
      case 'tool-call':
        head(node, 'calls', part.name);
        node.appendChild(el('pre', 'args', pretty(part.arguments)));
        break;
      case 'tool-result':
        head(node, 'result of', part.name);
        node.appendChild(el('pre', 'output', pretty(part.output)));
        break;
      case 'tool-error': {
        const error = part.error || {};
        head(node, 'error of', part.name);
        node.appendChild(el('div', 'error', `Error [${error.code}]: ${error.message}`));
        break;
      }
      case 'approval-requested':
        node.dataset.approvalId = String(part.approval_id);
        head(node, 'asks to run', part.name);
        node.appendChild(el('div', 'reason', part.reason));
        node.appendChild(el('pre', 'args', pretty(part.arguments)));
        node.appendChild(el('div', 'hint', 'Answer it under “Waiting for approval”.'));
        break;
      case 'approval-decided': {
        const how = part.approved ? 'approved' : 'denied';
        const by = part.by ? ` by ${part.by}` : '';
        const remember = part.remember ? ' (for the rest of the run)' : '';
        head(node, `${how}${by}${remember}`, part.name);
        break;
      }
      case 'rule': {
        // What the loop's policy did is there for whoever wants it, folded
        // under its step: the person's view is the calls and the answer.
        const fold = el('details', 'fold');
        fold.appendChild(el('summary', 'label', `policy: ${part.rule}`));
        fold.appendChild(el('div', 'detail', part.detail));
        node.appendChild(fold);
        break;
      }
      case 'finish':
        node.appendChild(el('span', 'label', `finished (${part.reason})`));
        break;
      case 'error':
        node.appendChild(el('div', 'error', part.message));
        break;
      default:
        node.appendChild(el('pre', 'output', pretty(part)));
    }
    return node;
  }

  // A session's messages as transcript items.
  function historyItems(messages) {
    const items = [];
    for (const m of messages || []) {
      if (m.role === 'user') {
        items.push({ kind: 'user', text: m.content });
      } else if (m.role === 'assistant') {
        if (m.content) items.push({ kind: 'part', seq: null, part: { type: 'text', depth: 0, text: m.content } });
        for (const c of m.tool_calls || []) {
          items.push({ kind: 'part', seq: null, part: { type: 'tool-call', depth: 0, call_id: c.id, name: c.name, arguments: c.arguments } });
        }
      } else if (m.role === 'tool') {
        const part = m.is_error
          ? { type: 'tool-error', depth: 0, name: m.name, error: { code: 'error', message: m.content } }
          : { type: 'tool-result', depth: 0, name: m.name, output: m.content };
        if (m.is_error) {
          // The history keeps `Error [code]: message`; show it as it is.
          const found = /^Error \[([^\]]+)\]: ([\s\S]*)$/.exec(m.content);
          if (found) part.error = { code: found[1], message: found[2] };
        }
        items.push({ kind: 'part', seq: null, part });
      }
    }
    return items;
  }

  // -------------------------------------------------------------------
  // Runs

  function stopReading() {
    if (state.reading) {
      state.reading.abort();
      state.reading = null;
    }
  }

  async function send(text) {
    const view = state.view;
    const agent = $('agent').value;
    if (!agent) return;
    if (view.agent !== agent) {
      // Another agent: another conversation.
      showView(newView(agent));
    }
    addItem({ kind: 'user', text });
    saveView();
    setRunning(true);
    setStatus('Starting…');
    const path = state.view.session
      ? `/v1/sessions/${encodeURIComponent(state.view.session)}/runs`
      : `/v1/agents/${encodeURIComponent(agent)}/runs`;
    let response;
    try {
      response = await call('POST', path, { input: text });
    } catch (e) {
      setRunning(false);
      if (e.status !== 401) setStatus(`The run did not start: ${e.message}`, true);
      return;
    }
    if (!response.ok) {
      setRunning(false);
      setStatus(`The run did not start: ${await errorOf(response)}`, true);
      return;
    }
    const run = {
      id: response.headers.get('x-run-id'),
      agent,
      lastId: 0,
    };
    const session = response.headers.get('x-session-id');
    if (session && !state.view.session) {
      state.view.session = session;
      state.view.title = text.slice(0, 80);
      $('session-title').textContent = state.view.title;
    }
    state.view.run = run;
    saveView();
    follow(run, response);
  }

  // Reads a run's events until its agent's own end: from `response` when
  // the run was just started, else from the log, after the last part seen
  // (`Last-Event-ID`). A stream that breaks off is read again from there.
  async function follow(run, response) {
    stopReading();
    const controller = new AbortController();
    state.reading = controller;
    setRunning(true);
    setStatus('Running…');
    let ended = false;
    const onEvent = (event) => {
      if (event.event !== 'part') return;
      const seq = Number(event.id);
      // A part seen already (a reconnect that overlaps) is not shown twice.
      if (Number.isFinite(seq) && seq <= run.lastId) return;
      let part;
      try {
        part = JSON.parse(event.data);
      } catch (_) {
        return;
      }
      addItem({ kind: 'part', seq: Number.isFinite(seq) ? seq : null, run: run.id, part });
      if (Number.isFinite(seq)) run.lastId = seq;
      setStatus('Running…');
      if (part.type === 'approval-requested' || part.type === 'approval-decided') refreshApprovals();
      if ((part.type === 'finish' || part.type === 'error') && Number(part.depth) === 0) ended = true;
      saveView();
    };
    for (let attempt = 0; !controller.signal.aborted; attempt += 1) {
      try {
        if (!response) {
          response = await call('GET', `/v1/runs/${encodeURIComponent(run.id)}/events`, undefined, {
            'Last-Event-ID': String(run.lastId),
          });
          if (!response.ok) throw new ApiError(response.status, await errorOf(response));
        }
        await readEvents(response, onEvent, controller.signal);
      } catch (e) {
        if (controller.signal.aborted || e.status === 401) return;
        // No such run, or a server that keeps no log to read it from.
        if (e.status === 404 || e.status === 400 || e.status === 503) {
          finishRun(run, `The run cannot be followed: ${e.message}`, true);
          return;
        }
      }
      response = null;
      if (ended) break;
      if (controller.signal.aborted) return;
      // The stream ended before the run did: a dropped connection, or a
      // run the host no longer drives (interrupted by a restart).
      const status = await runStatus(run);
      if (status && status !== 'running' && status !== 'waiting-for-approval') {
        finishRun(run, `The run is ${status}.`, true);
        return;
      }
      // A run an earlier process left waiting for a person has no live
      // stream until its question is answered (which wakes this up).
      setStatus(status === 'waiting-for-approval' ? 'Waiting for approval…' : 'Reconnecting…');
      await new Promise((resolve) => {
        state.wake = resolve;
        setTimeout(resolve, Math.min(RECONNECT_MS * (attempt + 1), 10000));
      });
      state.wake = null;
    }
    if (ended && state.reading === controller) finishRun(run, '', false);
  }

  async function runStatus(run) {
    const session = state.view && state.view.session;
    if (!session) return null;
    try {
      const read = await callJson('GET', `/v1/sessions/${encodeURIComponent(session)}`);
      const found = (read.runs || []).find((r) => r.id === run.id);
      return found ? found.status : null;
    } catch (_) {
      return null;
    }
  }

  function finishRun(run, message, isError) {
    if (state.view && state.view.run && state.view.run.id === run.id) {
      state.view.run = null;
      saveView();
    }
    state.reading = null;
    setRunning(false);
    setStatus(message, isError);
    refreshSessions();
    refreshApprovals();
  }

  async function stop() {
    const run = state.view && state.view.run;
    if (!run) return;
    try {
      await callJson('POST', `/v1/agents/${encodeURIComponent(run.agent)}/runs/${encodeURIComponent(run.id)}/stop`);
    } catch (e) {
      if (e.status !== 401) setStatus(`Could not stop the run: ${e.message}`, true);
    }
  }

  // -------------------------------------------------------------------
  // Sessions

  async function refreshSessions() {
    const list = $('sessions');
    let answer;
    try {
      answer = await callJson('GET', '/v1/sessions');
    } catch (e) {
      if (e.status === 401) return;
      clear(list);
      $('sessions-note').textContent = e.status === 503
        ? 'This server keeps no conversations.'
        : `Could not list the conversations: ${e.message}`;
      return;
    }
    clear(list);
    const sessions = answer.sessions || [];
    $('sessions-note').textContent = sessions.length ? '' : 'None yet.';
    for (const s of sessions) {
      const item = el('li');
      item.dataset.session = s.id;
      const button = el('button', 'session');
      button.type = 'button';
      button.appendChild(el('span', 'title', s.title || '(untitled)'));
      const when = new Date(s.updated_at).toLocaleString();
      button.appendChild(el('span', 'meta', `${s.agent} · ${s.message_count} ${s.message_count === 1 ? 'message' : 'messages'} · ${when}`));
      button.addEventListener('click', () => openSession(s.id));
      item.appendChild(button);
      list.appendChild(item);
    }
    highlightSession();
  }

  function highlightSession() {
    const current = state.view && state.view.session;
    for (const item of $('sessions').children) {
      item.classList.toggle('current', item.dataset.session === current);
    }
  }

  async function openSession(id) {
    let read;
    try {
      read = await callJson('GET', `/v1/sessions/${encodeURIComponent(id)}`);
    } catch (e) {
      if (e.status !== 401) setStatus(`Could not open the conversation: ${e.message}`, true);
      return;
    }
    if (!agentNamed(read.agent)) {
      setStatus(`Its agent, ${read.agent}, is not hosted here any more.`, true);
      return;
    }
    const view = newView(read.agent);
    view.session = read.id;
    view.title = read.title;
    view.items = historyItems(read.messages);
    // A run that still goes (or waits for a person) is followed; its
    // request is in the history already, its answer is not yet.
    const runs = read.runs || [];
    const last = runs[runs.length - 1];
    if (last && (last.status === 'running' || last.status === 'waiting-for-approval')) {
      view.run = { id: last.id, agent: read.agent, lastId: 0 };
    }
    showView(view);
    setStatus('');
    if (view.run) follow(view.run, null);
  }

  // -------------------------------------------------------------------
  // Approvals

  let approvalsSeq = 0;

  async function refreshApprovals() {
    const mine = (approvalsSeq += 1);
    let answer;
    try {
      answer = await callJson('GET', '/v1/approvals');
    } catch (e) {
      return;
    }
    // An older answer that arrives after a newer one is stale.
    if (mine !== approvalsSeq) return;
    const list = $('approvals');
    const pending = answer.approvals || [];
    const shown = new Map();
    for (const item of Array.from(list.children)) shown.set(item.dataset.approval, item);
    const keep = new Set(pending.map((p) => `${p.run_id}/${p.approval_id}`));
    for (const [key, item] of shown) {
      if (!keep.has(key)) list.removeChild(item);
    }
    for (const p of pending) {
      const key = `${p.run_id}/${p.approval_id}`;
      if (!shown.has(key)) list.appendChild(renderApproval(p, key));
    }
    $('approvals-empty').hidden = pending.length > 0;
  }

  function renderApproval(p, key) {
    const item = el('li', 'approval');
    item.dataset.approval = key;
    item.dataset.approvalId = p.approval_id;
    item.dataset.tool = p.tool;
    const line = head(item, p.agent === p.run_agent ? p.agent : `${p.agent} (in ${p.run_agent})`, p.tool);
    line.classList.add('who');
    item.appendChild(el('div', 'reason', p.reason));
    item.appendChild(el('pre', 'args', pretty(p.arguments)));
    const note = el('input', 'note');
    note.type = 'text';
    note.placeholder = 'Why (shown to the model when denied)';
    item.appendChild(note);
    const remember = el('label', 'remember');
    const box = el('input');
    box.type = 'checkbox';
    box.className = 'for-session';
    remember.appendChild(box);
    remember.appendChild(document.createTextNode(' the same for this tool in the rest of the run'));
    item.appendChild(remember);
    const buttons = el('div', 'buttons');
    const approve = el('button', 'approve', 'Approve');
    approve.type = 'button';
    const deny = el('button', 'deny', 'Deny');
    deny.type = 'button';
    const message = el('div', 'error');
    const answer = async (yes) => {
      approve.disabled = true;
      deny.disabled = true;
      const body = { approve: yes, for_session: box.checked };
      if (note.value.trim()) body.note = note.value.trim();
      try {
        const reply = await callJson(
          'POST',
          `/v1/agents/${encodeURIComponent(p.run_agent)}/runs/${encodeURIComponent(p.run_id)}/approvals/${encodeURIComponent(p.approval_id)}`,
          body,
        );
        // A run an earlier process left that cannot go on says why.
        if (reply && reply.resumed === false && reply.not_resumed) {
          const why = `The run did not go on: ${reply.not_resumed}`;
          if (state.view && state.view.run && state.view.run.id === p.run_id) {
            addItem({ kind: 'note', text: why });
            saveView();
          } else {
            setStatus(why, true);
          }
        }
      } catch (e) {
        if (e.status === 401) return;
        message.textContent = e.message;
        approve.disabled = false;
        deny.disabled = false;
      }
      refreshApprovals();
      // A question of a run an earlier process left: the run goes on here
      // now, so a page that follows it reads its events again at once.
      if (p.live === false) {
        refreshSessions();
        if (state.wake) state.wake();
      }
    };
    approve.addEventListener('click', () => answer(true));
    deny.addEventListener('click', () => answer(false));
    buttons.appendChild(approve);
    buttons.appendChild(deny);
    item.appendChild(buttons);
    item.appendChild(message);
    return item;
  }

  function startPolling() {
    stopPolling();
    state.pollTimer = setInterval(() => {
      if (document.visibilityState === 'visible') refreshApprovals();
    }, APPROVALS_POLL_MS);
  }

  function stopPolling() {
    if (state.pollTimer !== null) clearInterval(state.pollTimer);
    state.pollTimer = null;
  }

  // -------------------------------------------------------------------
  // Wiring

  function start() {
    $('token-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const token = $('token-input').value.trim();
      if (token) useToken(token);
    });
    $('forget-token').addEventListener('click', () => {
      sessionStorage.removeItem(VIEW_KEY);
      state.view = null;
      askForToken('');
    });
    $('ask-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const input = $('input');
      const text = input.value.trim();
      if (!text || $('send').disabled) return;
      input.value = '';
      send(text);
    });
    $('input').addEventListener('keydown', (event) => {
      // Enter sends, Shift+Enter is a new line.
      if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        $('ask-form').requestSubmit();
      }
    });
    $('stop').addEventListener('click', stop);
    $('new-session').addEventListener('click', () => {
      showView(newView($('agent').value || null));
      setStatus('');
    });
    $('agent').addEventListener('change', () => {
      showView(newView($('agent').value));
      setStatus('');
    });
    $('refresh-sessions').addEventListener('click', refreshSessions);
    $('provider').addEventListener('change', updateSwap);
    $('swap').addEventListener('click', swap);

    const token = tokenFromFragment() || sessionStorage.getItem(TOKEN_KEY);
    if (token) {
      useToken(token);
    } else {
      // No token, no call: the page asks first.
      askForToken('');
    }
  }

  start();
})();
