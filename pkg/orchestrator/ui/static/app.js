// berth dashboard. Plain JavaScript, no dependencies. Every string that
// comes from the API is put in the page with textContent, never as HTML:
// conversation ids, labels and reasons are chosen by clients and sandboxes.
'use strict';
(() => {
  const $ = (id) => document.getElementById(id);
  const API = '/ui/api';
  const LIVE = new Set(['PENDING', 'READY', 'PAUSED', 'RELEASING']);
  const STORE = 'berth.ui.session'; // sessionStorage: this tab only

  // el builds an element; attrs may hold class, text, title, dataset and
  // event handlers (on*); kids are nodes or strings (as text).
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else if (k === 'dataset') Object.assign(e.dataset, v);
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : v);
    }
    for (const kid of kids.flat()) {
      if (kid === undefined || kid === null || kid === false) continue;
      e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return e;
  }

  const S = {
    session: null, // {role, owner, csrf}
    leases: new Map(),
    flash: new Map(), // lease id -> time of its last change
    route: { view: '', id: '' },
    watch: null, // AbortController of the watch stream
    collections: [],
    leaseTimer: 0,
    log: null, // AbortController of the log stream
    term: null, // the open terminal: {term, ws, onWinResize}
    renderQueued: false,
  };

  // ---- formatting -------------------------------------------------------

  const stateName = (s) => String(s || '').replace(/^LEASE_STATE_/, '').replace(/^PROCESS_STATE_/, '') || '—';
  const ms = (t) => (t ? Date.parse(t) : NaN);
  const num = (v) => (v === undefined || v === null || v === '' ? 0 : Number(v));

  function dur(msv) {
    if (!isFinite(msv)) return '—';
    let s = Math.max(0, Math.round(msv / 1000));
    if (s < 60) return s + 's';
    let m = Math.floor(s / 60); s %= 60;
    if (m < 60) return m + 'm ' + String(s).padStart(2, '0') + 's';
    let h = Math.floor(m / 60); m %= 60;
    if (h < 48) return h + 'h ' + String(m).padStart(2, '0') + 'm';
    const d = Math.floor(h / 24); h %= 24;
    return d + 'd ' + h + 'h';
  }
  // cpuTime formats nanoseconds of CPU time.
  const cpuTime = (ns) => (ns < 1e9 ? Math.round(ns / 1e6) + 'ms' : ns < 60e9 ? (ns / 1e9).toFixed(1) + 's' : dur(ns / 1e6));
  // protoDur turns "600s" / "0.5s" into milliseconds.
  const protoDur = (v) => (typeof v === 'string' && v.endsWith('s') ? parseFloat(v) * 1000 : NaN);
  function bytes(v) {
    let n = num(v);
    if (!n) return '0';
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n : n.toFixed(n < 10 ? 1 : 0)) + ' ' + u[i];
  }
  const pad = (n) => String(n).padStart(2, '0');
  // absTime is local time as YYYY-MM-DD HH:MM:SS.
  const absTime = (t) => {
    const v = ms(t);
    if (!isFinite(v) || v <= 0) return '—';
    const d = new Date(v);
    return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) + ' ' +
      pad(d.getHours()) + ':' + pad(d.getMinutes()) + ':' + pad(d.getSeconds());
  };

  // rel is a span whose text the ticker keeps current: "since" counts up
  // from t, "until" down to t.
  function rel(kind, t, opts = {}) {
    const span = el('span', { class: 'rel', title: absTime(t) });
    span.dataset.kind = kind;
    span.dataset.t = String(ms(t));
    if (opts.soon) span.dataset.soon = '1';
    updateRel(span, Date.now());
    return span;
  }
  function updateRel(span, now) {
    const t = Number(span.dataset.t);
    if (!isFinite(t) || t <= 0) { span.textContent = '—'; return; }
    if (span.dataset.kind === 'since') {
      span.textContent = dur(now - t);
    } else if (span.dataset.kind === 'ago') {
      span.textContent = dur(now - t) + ' ago';
    } else {
      const left = t - now;
      span.textContent = left <= 0 ? 'now' : dur(left);
      span.classList.toggle('soon', !!span.dataset.soon && left < 60000);
    }
  }
  setInterval(() => {
    const now = Date.now();
    document.querySelectorAll('span.rel').forEach((s) => updateRel(s, now));
  }, 1000);

  function pill(state) {
    const n = stateName(state);
    return el('span', { class: 'pill s-' + n, text: n });
  }

  // usageShort is the table's one-line usage.
  function usageShort(u) {
    if (!u) return '';
    const parts = [];
    if (num(u.cpuPercent) > 0) parts.push('cpu ' + num(u.cpuPercent).toFixed(0) + '%');
    if (num(u.memoryBytes) > 0) parts.push('mem ' + bytes(u.memoryBytes));
    if (num(u.diskBytes) > 0) parts.push('disk ' + bytes(u.diskBytes));
    if (num(u.processes) > 0) parts.push(num(u.processes) + ' procs');
    return parts.join(' · ');
  }

  function toast(msg, bad) {
    const t = el('div', { class: 'toast' + (bad ? ' bad' : ''), role: bad ? 'alert' : 'status', text: msg });
    $('toasts').append(t);
    setTimeout(() => t.remove(), bad ? 8000 : 4000);
  }

  // ---- API --------------------------------------------------------------

  class APIError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  function headers(extra) {
    return Object.assign({ 'X-Berth-CSRF': S.session ? S.session.csrf : '' }, extra || {});
  }

  // needsSignIn reports (and acts on) a shim answer that the session is gone.
  function needsSignIn(r) {
    if (r.headers.get('X-Berth-Sign-In') === 'required') {
      signedOut('Your session ended: sign in again.');
      return true;
    }
    return false;
  }

  async function api(method, path, body) {
    const opts = { method, headers: headers(), cache: 'no-store', credentials: 'same-origin' };
    if (body !== undefined) {
      opts.headers['Content-Type'] = 'application/json';
      opts.body = JSON.stringify(body);
    }
    const r = await fetch(API + path, opts);
    const text = await r.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { /* not JSON */ }
    if (!r.ok) {
      needsSignIn(r);
      throw new APIError(r.status, (data && data.message) || text || r.statusText);
    }
    return data;
  }

  // stream reads a newline-delimited JSON response, calling onItem for
  // each {"result": …}; it returns when the stream ends.
  async function stream(path, signal, onItem, onOpen) {
    const r = await fetch(API + path, { headers: headers(), cache: 'no-store', credentials: 'same-origin', signal });
    if (!r.ok) {
      needsSignIn(r);
      let msg = r.statusText;
      try { msg = (await r.json()).message || msg; } catch (_) { /* keep */ }
      throw new APIError(r.status, msg);
    }
    if (onOpen) onOpen();
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i).trim();
        buf = buf.slice(i + 1);
        if (!line) continue;
        const msg = JSON.parse(line);
        if (msg.error) throw new APIError(0, msg.error.message || 'stream error');
        if (msg.result) onItem(msg.result);
      }
    }
  }

  const sleep = (t) => new Promise((res) => setTimeout(res, t));

  // ---- session ----------------------------------------------------------

  function saveSession(s) {
    S.session = s;
    if (s) sessionStorage.setItem(STORE, JSON.stringify(s));
    else sessionStorage.removeItem(STORE);
  }

  function signedOut(msg) {
    saveSession(null);
    if (S.watch) S.watch.abort();
    S.watch = null;
    S.leases.clear();
    clearInterval(S.leaseTimer);
    stopLog();
    closeTerminal('');
    for (const id of ['nav', 'live', 'who', 'signout']) $(id).hidden = true;
    showView('login');
    $('login-error').textContent = msg || '';
    $('token').focus();
  }

  async function signIn(ev) {
    ev.preventDefault();
    const tok = $('token').value.trim();
    $('login-error').textContent = '';
    try {
      const r = await fetch('/ui/login', {
        method: 'POST', credentials: 'same-origin', cache: 'no-store',
        headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ token: tok }),
      });
      const data = await r.json().catch(() => ({}));
      if (!r.ok) throw new Error(data.message || r.statusText);
      $('token').value = '';
      saveSession({ role: data.role, owner: data.owner, csrf: data.csrf, terminal: !!data.terminal });
      started();
    } catch (e) {
      $('login-error').textContent = e.message;
    }
  }

  async function signOut() {
    try {
      await fetch('/ui/logout', { method: 'POST', credentials: 'same-origin', headers: headers() });
    } catch (_) { /* the cookie goes anyway when it expires */ }
    signedOut('Signed out.');
  }

  // started runs once the session is known to be good.
  function started() {
    const s = S.session;
    const who = $('who');
    who.replaceChildren(s.role === 'operator' ? el('b', { text: 'operator' }) : el('span', {}, 'client ', el('b', { text: s.owner })));
    document.body.classList.toggle('is-operator', s.role === 'operator');
    for (const id of ['nav', 'live', 'who', 'signout']) $(id).hidden = false;
    watchLoop();
    probeCollections();
    route();
  }

  // ---- lease store and watch -------------------------------------------

  function upsert(l) {
    if (!l || !l.id) return;
    const old = S.leases.get(l.id);
    if (old && ms(old.updatedAt) > ms(l.updatedAt)) return; // an older copy
    // List leaves out some usage figures that Get fills, and a lease that
    // stopped running reports none: keep the last ones (their "sampled"
    // time tells how old they are).
    if (old && old.usage && l.usage && !l.usage.sampledAt && old.usage.sampledAt) {
      l.usage = Object.assign({}, old.usage, { diskBytes: l.usage.diskBytes, measuredAt: l.usage.measuredAt });
    } else if (old && old.usage && !l.usage) {
      l.usage = old.usage;
    }
    if (!old || old.state !== l.state || old.updatedAt !== l.updatedAt) S.flash.set(l.id, Date.now());
    S.leases.set(l.id, l);
  }

  async function listAll() {
    const fresh = new Map();
    let token = '';
    for (let page = 0; page < 20; page++) {
      const q = new URLSearchParams({ includeEnded: 'true', pageSize: '1000' });
      if (token) q.set('pageToken', token);
      const r = await api('GET', '/v1/leases?' + q);
      for (const l of r.leases || []) fresh.set(l.id, l);
      token = r.nextPageToken;
      if (!token) break;
    }
    // The list is the truth; keep Get's richer usage where it is newer.
    for (const [id, l] of fresh) {
      const old = S.leases.get(id);
      if (old && ms(old.updatedAt) > ms(l.updatedAt)) fresh.set(id, old);
    }
    S.leases = fresh;
  }

  function setLive(state, text) {
    const e = $('live');
    e.classList.toggle('ok', state === 'ok');
    e.classList.toggle('down', state === 'down');
    $('live-text').textContent = text;
  }

  async function watchLoop() {
    let backoff = 500;
    while (S.session) {
      const ctl = new AbortController();
      S.watch = ctl;
      try {
        // Open the stream first (events buffer while the list loads);
        // upsert drops copies older than what the list returned.
        let opened = false;
        const events = [];
        let deliver = (ev) => events.push(ev);
        const done = stream('/v1/leases:watch', ctl.signal, (ev) => deliver(ev), () => { opened = true; });
        done.catch(() => {}); // observed below
        await listAll();
        scheduleRender();
        deliver = (ev) => { upsert(ev.lease); scheduleRender(); };
        events.forEach(deliver);
        setLive('ok', 'live');
        backoff = 500;
        await done;
        if (!opened) throw new Error('watch closed');
      } catch (e) {
        if (!S.session || ctl.signal.aborted) return;
        if (e instanceof APIError && e.status === 401) return;
      }
      setLive('down', 'reconnecting');
      await sleep(backoff);
      backoff = Math.min(backoff * 2, 10000);
    }
  }

  // ---- routing ----------------------------------------------------------

  function showView(name) {
    for (const v of ['login', 'leases', 'lease', 'collection']) $('view-' + v).hidden = v !== name;
  }

  function parseHash() {
    const h = location.hash.replace(/^#/, '') || '/';
    const [p, q] = h.split('?');
    return { path: p, query: new URLSearchParams(q || '') };
  }

  function route() {
    if (!S.session) { showView('login'); return; }
    clearInterval(S.leaseTimer);
    stopLog();
    closeTerminal('');
    const { path, query } = parseHash();
    let m;
    document.querySelectorAll('#nav a').forEach((a) => a.classList.remove('on'));
    if ((m = path.match(/^\/lease\/([0-9a-v]+)$/))) {
      S.route = { view: 'lease', id: m[1] };
      showView('lease');
      openLease(m[1]);
    } else if ((m = path.match(/^\/c\/([a-z]+)$/))) {
      S.route = { view: 'collection', id: m[1] };
      navOn(m[1]);
      showView('collection');
      openCollection(m[1]);
    } else {
      S.route = { view: 'leases', id: '' };
      navOn('leases');
      for (const [k, id] of [['state', 'f-state'], ['owner', 'f-owner'], ['label', 'f-label'], ['q', 'f-text']]) {
        if (query.has(k)) $(id).value = query.get(k);
      }
      showView('leases');
      renderLeases();
    }
  }
  function navOn(name) {
    const a = document.querySelector('#nav a[data-nav="' + name + '"]');
    if (a) a.classList.add('on');
  }

  function scheduleRender() {
    if (S.renderQueued) return;
    S.renderQueued = true;
    requestAnimationFrame(() => {
      S.renderQueued = false;
      if (S.route.view === 'leases') renderLeases();
      else if (S.route.view === 'lease') renderLease();
    });
  }

  // ---- leases table -----------------------------------------------------

  function filters() {
    return {
      state: $('f-state').value,
      owner: $('f-owner').value.trim().toLowerCase(),
      label: $('f-label').value.trim(),
      text: $('f-text').value.trim().toLowerCase(),
    };
  }

  function labelMatch(labels, sel) {
    if (!sel) return true;
    labels = labels || {};
    return sel.split(',').map((t) => t.trim()).filter(Boolean).every((term) => {
      const i = term.indexOf('=');
      if (i < 0) return Object.prototype.hasOwnProperty.call(labels, term);
      return labels[term.slice(0, i).trim()] === term.slice(i + 1).trim();
    });
  }

  function matches(l, f) {
    const st = stateName(l.state);
    if (f.state === 'live' && !LIVE.has(st)) return false;
    if (f.state !== 'live' && f.state !== 'all' && st !== f.state) return false;
    if (f.owner && !String(l.owner || '').toLowerCase().includes(f.owner)) return false;
    if (!labelMatch(l.labels, f.label)) return false;
    if (f.text) {
      const hay = [l.id, l.conversationId, l.image].join(' ').toLowerCase();
      if (!hay.includes(f.text)) return false;
    }
    return true;
  }

  function saveFilters() {
    const f = filters();
    const q = new URLSearchParams();
    if (f.state !== 'live') q.set('state', f.state);
    if ($('f-owner').value.trim()) q.set('owner', $('f-owner').value.trim());
    if (f.label) q.set('label', f.label);
    if ($('f-text').value.trim()) q.set('q', $('f-text').value.trim());
    const s = q.toString();
    history.replaceState(null, '', '#/' + (s ? '?' + s : ''));
    renderLeases();
  }

  function renderLeases() {
    const f = filters();
    const all = [...S.leases.values()];
    const rows = all.filter((l) => matches(l, f)).sort((a, b) => ms(b.createdAt) - ms(a.createdAt));
    const now = Date.now();
    const tbody = $('leases').tBodies[0];
    const frag = document.createDocumentFragment();
    for (const l of rows) {
      const st = stateName(l.state);
      const ended = !LIVE.has(st);
      const since = now - (S.flash.get(l.id) || 0);
      const flashed = since < 1600;
      let expires;
      if (ended) expires = el('span', { class: 'muted', text: '—' });
      else if (st === 'PAUSED') expires = el('span', { class: 'muted', text: 'paused' });
      else expires = rel('until', l.expiresAt, { soon: true });
      const labels = Object.entries(l.labels || {}).sort().map(([k, v]) => el('span', { class: 'chip', text: k + '=' + v }));
      const tr = el('tr', { class: [ended ? 'ended' : '', flashed ? 'flash' : ''].join(' ').trim() || undefined, dataset: { id: l.id, state: st } },
        el('td', {}, pill(l.state), (l.warnings || []).length ? el('span', { class: 'warnmark', title: l.warnings.join('\n'), text: ' ⚠' }) : null),
        el('td', { class: 'mono' }, el('a', { href: '#/lease/' + l.id, text: l.id })),
        el('td', { class: 'conv mono', title: l.conversationId, text: l.conversationId }),
        el('td', { text: l.owner }),
        el('td', { class: 'image', title: l.image, text: l.image }),
        el('td', { class: 'num' }, rel('since', l.createdAt)),
        el('td', { class: 'num' }, expires),
        el('td', { class: 'muted', text: usageShort(l.usage) }),
        el('td', {}, labels),
        el('td', { class: 'reason fill', title: l.reason, text: l.reason }),
      );
      // A row rebuilt mid-highlight carries on where it was.
      if (flashed) tr.style.animationDelay = -since + 'ms';
      frag.append(tr);
    }
    tbody.replaceChildren(frag);
    $('leases-empty').hidden = rows.length > 0;
    const live = all.filter((l) => LIVE.has(stateName(l.state))).length;
    document.title = live + ' live · berth';
    $('counts').textContent = rows.length + ' shown · ' + live + ' live · ' + all.length + ' known';
    const byState = {};
    for (const l of all) byState[stateName(l.state)] = (byState[stateName(l.state)] || 0) + 1;
    $('summary').replaceChildren(...['READY', 'PENDING', 'PAUSED', 'RELEASING', 'FAILED', 'EXPIRED', 'RELEASED'].map((st) =>
      el('button', { type: 'button', class: 'sum s-' + st + (f.state === st ? ' on' : '') + (byState[st] ? '' : ' zero'),
        title: 'show only ' + st + ' leases', dataset: { state: st } },
      el('b', { text: String(byState[st] || 0) }), ' ' + st.toLowerCase())));
    const owners = [...new Set(all.map((l) => l.owner).filter(Boolean))].sort();
    $('owners').replaceChildren(...owners.map((o) => el('option', { value: o })));
  }

  // ---- lease page -------------------------------------------------------

  async function openLease(id) {
    $('l-id').textContent = id;
    $('l-processes').tBodies[0].replaceChildren();
    $('p-note').textContent = '';
    renderLease();
    await refreshLease(id, true);
    S.leaseTimer = setInterval(() => refreshLease(id, false), 5000);
  }

  // refreshLease gets the lease (Get fills the usage figures that List
  // leaves out) and, the first time, its processes.
  async function refreshLease(id, first) {
    if (S.route.view !== 'lease' || S.route.id !== id) return;
    try {
      const l = await api('GET', '/v1/leases/' + encodeURIComponent(id));
      upsert(l);
      // Get is the newest copy: take its usage even when updatedAt is equal.
      const cur = S.leases.get(id);
      if (cur && l.usage && ms(l.usage.sampledAt) >= ms((cur.usage || {}).sampledAt || 0)) cur.usage = l.usage;
      renderLease();
      if (first) {
        loadProcesses(id);
        loadLog(id, false);
      }
    } catch (e) {
      if (first) {
        $('l-conv').textContent = e.message;
        $('l-state').className = 'pill';
        $('l-state').textContent = 'ERROR';
      }
    }
  }

  function kv(dl, rows) {
    dl.replaceChildren();
    for (const [k, v] of rows) {
      if (v === undefined || v === null || v === '' || (Array.isArray(v) && !v.length)) continue;
      dl.append(el('dt', { text: k }), el('dd', {}, v));
    }
  }

  function bar(used, limit) {
    if (!limit || !used) return null;
    const pct = Math.min(100, (100 * used) / limit);
    const b = el('span', { class: 'bar', title: pct.toFixed(0) + '%' }, el('i'));
    b.firstChild.style.width = pct.toFixed(1) + '%';
    return b;
  }

  function renderLease() {
    if (S.route.view !== 'lease') return;
    const l = S.leases.get(S.route.id);
    if (!l) return;
    const st = stateName(l.state);
    const live = LIVE.has(st);
    const op = S.session && S.session.role === 'operator';
    const ps = $('l-state');
    ps.className = 'pill s-' + st;
    ps.textContent = st;
    $('l-conv').textContent = l.conversationId;
    $('l-reason').textContent = l.reason || '';
    document.title = st + ' ' + l.conversationId + ' · berth';

    const can = {
      renew: st === 'READY' || st === 'PENDING',
      freeze: st === 'READY',
      hibernate: st === 'READY',
      resume: st === 'PAUSED',
      release: live && st !== 'RELEASING',
      reap: op && live && st !== 'RELEASING',
    };
    $('l-actions').querySelectorAll('button').forEach((b) => {
      b.disabled = !can[b.dataset.act];
      if (b.dataset.act === 'reap') b.hidden = !op;
    });

    if (st !== 'READY' && $('l-processes').tBodies[0].rows.length) {
      // What the agent listed no longer holds: paused, ended or restarting.
      $('l-processes').tBodies[0].replaceChildren();
      $('p-note').textContent = 'read from a READY sandbox only (looking never resumes a paused one)';
    }
    $('t-card').hidden = !(S.session && S.session.terminal);
    $('t-open').disabled = st !== 'READY';
    $('t-open').title = st === 'READY' ? 'Open a shell in the sandbox' : 'a terminal opens in a READY sandbox';
    $('l-warnings').replaceChildren(...(l.warnings || []).map((w) => el('div', { class: 'warn', text: '⚠ ' + w })));

    const r = l.resources || {};
    const res = [];
    if (num(r.cpus)) res.push(num(r.cpus) + ' CPU');
    if (num(r.memoryBytes)) res.push(bytes(r.memoryBytes) + ' memory');
    if (num(r.pids)) res.push(num(r.pids) + ' pids');
    if (num(r.diskBytes)) res.push(bytes(r.diskBytes) + ' disk');
    let expires;
    if (!live) expires = el('span', { class: 'muted', text: 'ended' });
    else if (st === 'PAUSED') expires = el('span', { class: 'muted', text: 'not while paused' });
    else expires = el('span', {}, rel('until', l.expiresAt, { soon: true }), el('span', { class: 'muted', text: ' · ' + absTime(l.expiresAt) }));
    kv($('l-details'), [
      ['Lease', el('span', { class: 'mono', text: l.id })],
      ['Conversation', el('span', { class: 'mono', text: l.conversationId })],
      ['Owner', l.owner],
      ['Image', el('span', { class: 'mono', text: l.image })],
      ['User', l.user],
      ['Created', el('span', {}, rel('ago', l.createdAt), el('span', { class: 'muted', text: ' · ' + absTime(l.createdAt) }))],
      ['Expires in', expires],
      ['Last activity', ms(l.lastActivityAt) > 0 ? rel('ago', l.lastActivityAt) : null],
      ['Ended', ms(l.endedAt) > 0 ? el('span', {}, rel('ago', l.endedAt), el('span', { class: 'muted', text: ' · ' + absTime(l.endedAt) })) : null],
      ['TTL', dur(protoDur(l.ttl))],
      ['Idle timeout', protoDur(l.idleTimeout) > 0 ? dur(protoDur(l.idleTimeout)) + (l.idlePolicy ? ' then ' + l.idlePolicy : '') : 'none'],
      ['Phase', l.phase || null],
      ['Paused', l.paused ? el('span', {}, l.paused + ' · ', rel('ago', l.pausedAt)) : null],
      ['Restarts', num(l.restarts) ? String(l.restarts) : null],
      ['Resources', res.join(' · ')],
      ['Labels', Object.entries(l.labels || {}).sort().map(([k, v]) => el('span', { class: 'chip', text: k + '=' + v }))],
      ['Secrets', (l.secretNames || []).map((n) => el('span', { class: 'chip', text: n }))],
      ['Public ports', (l.publicPorts || []).join(', ')],
      ['Container', l.containerId ? el('span', { class: 'mono', title: l.containerId, text: l.containerId.slice(0, 12) }) : null],
      ['Endpoint', l.endpoint ? el('span', { class: 'mono', text: l.endpoint }) : null],
    ]);

    const u = l.usage;
    if (!u) {
      kv($('l-usage'), [['—', el('span', { class: 'muted', text: 'no figures: the runtime reports none, or the sandbox is not running' })]]);
    } else {
      kv($('l-usage'), [
        ['CPU', u.sampledAt ? el('span', {}, num(u.cpuPercent).toFixed(1) + '% · ' + cpuTime(num(u.cpuNanos)) + ' CPU time') : null],
        ['Memory', num(u.memoryBytes) ? el('span', {}, bytes(u.memoryBytes) + (num(u.memoryLimitBytes) ? ' of ' + bytes(u.memoryLimitBytes) : ''), bar(num(u.memoryBytes), num(u.memoryLimitBytes))) : null],
        ['Memory peak', num(u.memoryPeakBytes) ? bytes(u.memoryPeakBytes) : null],
        ['Disk', el('span', {}, bytes(u.diskBytes) + (num(r.diskBytes) ? ' of ' + bytes(r.diskBytes) : ''), bar(num(u.diskBytes), num(r.diskBytes)))],
        ['Network', u.sampledAt ? '↓ ' + bytes(u.networkRxBytes) + ' · ↑ ' + bytes(u.networkTxBytes) : null],
        ['Processes', num(u.processes) ? String(num(u.processes)) + (num(r.pids) ? ' of ' + num(r.pids) : '') : null],
        ['Sampled', ms(u.sampledAt) > 0 ? rel('ago', u.sampledAt) : null],
        ['Disk measured', ms(u.measuredAt) > 0 ? rel('ago', u.measuredAt) : null],
      ]);
    }

    const trs = (l.transitions || []).slice();
    $('l-transitions').tBodies[0].replaceChildren(...trs.map((t) => el('tr', {},
      el('td', { class: 'mono', text: absTime(t.at) }),
      el('td', { class: 'num' }, rel('ago', t.at)),
      el('td', {}, stateName(t.from) === 'UNSPECIFIED' ? '' : pill(t.from)),
      el('td', { class: 'arrow', text: '→' }),
      el('td', {}, pill(t.to)),
      el('td', { class: 'fill', text: t.reason }),
    )));
  }

  async function loadProcesses(id) {
    const l = S.leases.get(id);
    const tbody = $('l-processes').tBodies[0];
    const note = $('p-note');
    if (!l || stateName(l.state) !== 'READY') {
      tbody.replaceChildren();
      note.textContent = 'read from a READY sandbox only (looking never resumes a paused one)';
      return;
    }
    note.textContent = 'loading…';
    try {
      const r = await api('GET', '/v1/sandboxes/' + encodeURIComponent(id) + '/v1/processes');
      const ps = (r && r.processes) || [];
      tbody.replaceChildren(...ps.map((p) => {
        const st = stateName(p.state);
        const exited = st !== 'RUNNING';
        return el('tr', {},
          el('td', { class: 'mono', text: p.id }),
          el('td', { class: 'num', text: p.pid || '' }),
          el('td', { class: 'mono fill', title: (p.argv || []).join(' '), text: p.command || (p.argv || []).join(' ') }),
          el('td', {}, el('span', { class: 'pill s-' + st, text: st })),
          el('td', { class: 'num', text: exited ? (p.signal || String(p.exitCode)) + (p.oomKilled ? ' (OOM)' : '') + (p.timedOut ? ' (timeout)' : '') : '' }),
          el('td', { class: 'num' }, rel('ago', p.startedAt)),
          el('td', { class: 'mono muted', text: p.cwd || '' }),
        );
      }));
      note.textContent = ps.length ? 'background processes, as of ' + new Date().toLocaleTimeString(undefined, { hour12: false })
        : 'no background processes';
    } catch (e) {
      note.textContent = e.message;
    }
  }

  // ---- log ------------------------------------------------------------

  const LOG_TAIL = 200;
  const LOG_MAX = 2000; // lines kept in the page

  function stopLog() {
    if (S.log) S.log.abort();
    S.log = null;
  }

  // loadLog shows the lease's log (GET /v1/leases/ID/logs): the container's
  // output and the lease's transitions, the last LOG_TAIL lines, then, when
  // following, each new line as it comes.
  async function loadLog(id, follow) {
    stopLog();
    const ctl = new AbortController();
    S.log = ctl;
    const box = $('l-log');
    const note = $('log-note');
    const btn = $('log-follow');
    btn.setAttribute('aria-pressed', String(follow));
    btn.classList.toggle('on', follow);
    box.replaceChildren();
    note.textContent = 'loading…';
    const q = new URLSearchParams({ tail: String(LOG_TAIL) });
    if (follow) q.set('follow', 'true');
    try {
      await stream('/v1/leases/' + encodeURIComponent(id) + '/logs?' + q, ctl.signal, (e) => {
        const stick = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
        const t = ms(e.time);
        const src = e.source || '';
        box.append(el('div', { class: 'logline src-' + src },
          el('span', { class: 't', title: absTime(e.time), text: isFinite(t) ? absTime(e.time).slice(11) : '' }),
          el('span', { class: 'src', text: src }),
          el('span', { class: 'x', text: e.text || '' })));
        while (box.childElementCount > LOG_MAX) box.firstElementChild.remove();
        if (stick) box.scrollTop = box.scrollHeight;
      }, () => { note.textContent = follow ? 'following' : ''; });
      if (!ctl.signal.aborted) {
        note.textContent = (box.childElementCount ? 'last ' + LOG_TAIL + ' lines' : 'no log lines') +
          (follow ? ' · the stream ended' : ', as of ' + absTime(new Date().toISOString()).slice(11));
        box.scrollTop = box.scrollHeight;
      }
    } catch (e) {
      if (!ctl.signal.aborted) note.textContent = e.message;
    } finally {
      if (S.log === ctl) {
        S.log = null;
        btn.setAttribute('aria-pressed', 'false');
        btn.classList.remove('on');
      }
    }
  }

  // ---- terminal (when the orchestrator was built with it) -------------

  let xtermLoad = null;
  // loadXterm adds xterm.js and its stylesheet to the page once.
  function loadXterm() {
    if (!xtermLoad) {
      xtermLoad = new Promise((resolve, reject) => {
        document.head.append(el('link', { rel: 'stylesheet', href: '/ui/xterm/xterm.css' }));
        const sc = el('script', { src: '/ui/xterm/xterm.bundle.js' });
        sc.onload = () => (window.BerthXterm ? resolve(window.BerthXterm) : reject(new Error('xterm.js did not load')));
        sc.onerror = () => reject(new Error('xterm.js did not load'));
        document.head.append(sc);
      });
      xtermLoad.catch(() => { xtermLoad = null; });
    }
    return xtermLoad;
  }

  function closeTerminal(note) {
    const t = S.term;
    S.term = null;
    if (t) {
      window.removeEventListener('resize', t.onWinResize);
      if (t.ws) t.ws.close(1000, 'detached');
      // A dispose that throws (xterm in the middle of a render) must not
      // leave the card half closed: the box, the buttons and the note
      // below are reset whatever xterm does.
      try { t.term.dispose(); } catch (e) { console.warn('terminal dispose', e); }
    }
    $('t-box').replaceChildren();
    $('t-box').hidden = true;
    $('t-close').hidden = true;
    $('t-open').hidden = false;
    if (note !== undefined) $('t-note').textContent = note;
  }

  // openTerminal opens a shell in the sandbox (the agent's terminal
  // WebSocket, through the shim: the CSRF value travels as a subprotocol,
  // since a browser's WebSocket cannot set headers).
  async function openTerminal(id) {
    closeTerminal('');
    $('t-note').textContent = 'connecting…';
    let Terminal;
    try { Terminal = await loadXterm(); } catch (e) { $('t-note').textContent = e.message; return; }
    if (S.route.view !== 'lease' || S.route.id !== id) return;
    const box = $('t-box');
    box.hidden = false;
    const dark = matchMedia('(prefers-color-scheme: dark)').matches;
    const term = new Terminal({
      fontFamily: getComputedStyle(document.documentElement).getPropertyValue('--mono'), fontSize: 13,
      screenReaderMode: true, // rows also as text in the page (assistive technology; the tests read them)
      theme: dark ? { background: '#0b0e12', foreground: '#d7dde5' } : { background: '#fbfcfd', foreground: '#1c2128', cursor: '#1c2128', selection: 'rgba(47,111,223,.25)' },
    });
    term.open(box);
    term.fit();
    const t = { term, ws: null, onWinResize: () => term.fit() };
    S.term = t;
    window.addEventListener('resize', t.onWinResize);
    const q = new URLSearchParams({ rows: String(term.rows), cols: String(term.cols) });
    const url = (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + API +
      '/v1/sandboxes/' + encodeURIComponent(id) + '/v1/terminals/ws?' + q;
    const ws = new WebSocket(url, ['berth.terminal.v1', 'berth.csrf.' + S.session.csrf]);
    ws.binaryType = 'arraybuffer';
    t.ws = ws;
    const dec = new TextDecoder();
    const enc = new TextEncoder();
    ws.onopen = () => { $('t-note').textContent = 'connected'; term.focus(); };
    ws.onmessage = (ev) => {
      if (typeof ev.data !== 'string') { term.write(dec.decode(new Uint8Array(ev.data), { stream: true })); return; }
      let m = {};
      try { m = JSON.parse(ev.data); } catch (_) { return; }
      if (m.type === 'session') $('t-note').textContent = 'session ' + m.id + ' · ' + (m.argv || []).join(' ') + ' as ' + m.user + ' · Detach leaves it running';
      else if (m.type === 'exit') term.write('\r\n[exited ' + (m.signal || m.code) + ']\r\n');
      else if (m.type === 'error') $('t-note').textContent = m.message;
    };
    ws.onclose = (ev) => {
      if (S.term !== t) return;
      $('t-note').textContent = ev.code === 1000 ? 'session ended' : 'disconnected (' + ev.code + (ev.reason ? ': ' + ev.reason : '') + ')';
    };
    term.on('data', (d) => { if (ws.readyState === 1) ws.send(enc.encode(d)); });
    term.on('resize', (sz) => { if (ws.readyState === 1) ws.send(JSON.stringify({ type: 'resize', rows: sz.rows, cols: sz.cols })); });
    $('t-open').hidden = true;
    $('t-close').hidden = false;
  }

  // confirmable makes a button ask once more before it acts.
  function confirmed(b) {
    if (b.classList.contains('confirm')) {
      b.classList.remove('confirm');
      b.textContent = b.dataset.label;
      return true;
    }
    b.dataset.label = b.textContent;
    b.classList.add('confirm');
    b.textContent = 'Confirm ' + b.dataset.label.toLowerCase() + '?';
    setTimeout(() => {
      if (b.classList.contains('confirm')) { b.classList.remove('confirm'); b.textContent = b.dataset.label; }
    }, 4000);
    return false;
  }

  async function act(ev) {
    const b = ev.target.closest('button[data-act]');
    if (!b || b.disabled) return;
    const id = S.route.id;
    const a = b.dataset.act;
    if ((a === 'release' || a === 'reap') && !confirmed(b)) return;
    const base = '/v1/leases/' + encodeURIComponent(id);
    b.disabled = true;
    try {
      let l;
      switch (a) {
        case 'renew': l = await api('POST', base + ':renew', {}); break;
        case 'freeze': l = await api('POST', base + ':pause', { mode: 'freeze' }); break;
        case 'hibernate': l = await api('POST', base + ':pause', { mode: 'hibernate' }); break;
        case 'resume': l = await api('POST', base + ':resume', {}); break;
        case 'release': l = await api('DELETE', base + '?reason=' + encodeURIComponent('released from the dashboard')); break;
        case 'reap':
          await api('POST', '/v1/leases:reap', { ids: [id], reason: 'reaped from the dashboard by the operator' });
          l = await api('GET', base);
          break;
      }
      upsert(l);
      renderLease();
      toast({ renew: 'Renewed', freeze: 'Paused (freeze)', hibernate: 'Paused (hibernate)', resume: 'Resumed', release: 'Released', reap: 'Reaped' }[a] + ' ' + id);
      if (a === 'resume') loadProcesses(id);
    } catch (e) {
      toast(e.message, true);
    } finally {
      renderLease();
    }
  }

  // ---- pools, volumes, snapshots (when the orchestrator serves them) ---

  const COLLECTIONS = [['pools', 'Pools'], ['volumes', 'Volumes'], ['snapshots', 'Snapshots']];

  async function probeCollections() {
    for (const [name, title] of COLLECTIONS) {
      try {
        await api('GET', '/v1/' + name);
        if (!document.querySelector('#nav a[data-nav="' + name + '"]')) {
          $('nav').append(el('a', { href: '#/c/' + name, dataset: { nav: name }, text: title }));
        }
      } catch (_) { /* not served by this orchestrator */ }
    }
    if (S.route.view === 'collection') navOn(S.route.id);
  }

  // colTitle turns a JSON field name into a column title: sizeBytes ->
  // size, lastUsedAt -> last used, conversationId -> conversation.
  const colTitle = (k) => k.replace(/(Bytes|At|Id)$/, '').replace(/([a-z])([A-Z])/g, '$1 $2').toLowerCase();

  // cell renders one field of a pools/volumes/snapshots item by its name.
  function cell(k, v) {
    if (v === null || v === undefined || v === '') return '';
    if (/Bytes$/.test(k)) return num(v) < 0 ? '—' : bytes(v);
    if (/At$/.test(k) && typeof v === 'string') return ms(v) > 0 ? rel('ago', v) : '—';
    if (k === 'leaseId') return el('a', { class: 'mono', href: '#/lease/' + v, text: v });
    if (typeof v === 'boolean') return v ? 'yes' : '';
    if (Array.isArray(v)) return v.map((x) => cell('', x)).join(', ');
    if (typeof v === 'object') return Object.entries(v).map(([kk, x]) => kk + '=' + cell('', x)).join(' ');
    return String(v).replace(/^[A-Z]+(_[A-Z]+)*_STATE_/, '');
  }

  async function openCollection(name) {
    const title = (COLLECTIONS.find((c) => c[0] === name) || [name, name])[1];
    $('c-title').textContent = title;
    document.title = title + ' · berth';
    const table = $('c-table');
    table.tHead.replaceChildren();
    table.tBodies[0].replaceChildren();
    try {
      const r = await api('GET', '/v1/' + name);
      const items = Object.values(r || {}).find(Array.isArray) || [];
      const cols = [];
      for (const it of items) for (const k of Object.keys(it)) if (!cols.includes(k) && cols.length < 12) cols.push(k);
      table.tHead.append(el('tr', {}, cols.map((c) => el('th', { class: /Bytes$|At$/.test(c) ? 'num' : '', text: colTitle(c) }))));
      table.tBodies[0].append(...items.map((it) => el('tr', {}, cols.map((c) =>
        el('td', { class: /Bytes$|At$/.test(c) ? 'num' : /name|Id$/.test(c) ? 'mono' : '' }, cell(c, it[c]))))));
      $('c-empty').hidden = items.length > 0;
      $('c-empty').textContent = 'Nothing here.';
    } catch (e) {
      $('c-empty').hidden = false;
      $('c-empty').textContent = e.message;
    }
  }

  // ---- start ------------------------------------------------------------

  async function boot() {
    $('login-form').addEventListener('submit', signIn);
    $('signout').addEventListener('click', signOut);
    $('l-actions').addEventListener('click', act);
    $('p-refresh').addEventListener('click', () => loadProcesses(S.route.id));
    $('t-open').addEventListener('click', () => openTerminal(S.route.id));
    $('t-close').addEventListener('click', () => closeTerminal('detached: the session keeps running in the sandbox'));
    $('log-reload').addEventListener('click', () => loadLog(S.route.id, false));
    $('log-follow').addEventListener('click', () => {
      if (S.log && $('log-follow').classList.contains('on')) { stopLog(); $('log-note').textContent = 'stopped'; return; }
      loadLog(S.route.id, true);
    });
    for (const id of ['f-state', 'f-owner', 'f-label', 'f-text']) $(id).addEventListener('input', saveFilters);
    $('summary').addEventListener('click', (ev) => {
      const b = ev.target.closest('button[data-state]');
      if (!b) return;
      $('f-state').value = $('f-state').value === b.dataset.state ? 'live' : b.dataset.state;
      saveFilters();
    });
    $('leases').addEventListener('click', (ev) => {
      const tr = ev.target.closest('tr[data-id]');
      if (tr && !ev.target.closest('a')) location.hash = '#/lease/' + tr.dataset.id;
    });
    window.addEventListener('hashchange', route);
    // "/" focuses the search box, Escape clears the filters' text.
    document.addEventListener('keydown', (ev) => {
      if (S.route.view !== 'leases' || ev.ctrlKey || ev.metaKey || ev.altKey) return;
      const typing = /^(INPUT|SELECT|TEXTAREA)$/.test(document.activeElement.tagName);
      if (ev.key === '/' && !typing) { ev.preventDefault(); $('f-text').focus(); }
      if (ev.key === 'Escape' && typing) {
        for (const id of ['f-owner', 'f-label', 'f-text']) $(id).value = '';
        document.activeElement.blur();
        saveFilters();
      }
    });
    let saved = null;
    try { saved = JSON.parse(sessionStorage.getItem(STORE) || 'null'); } catch (_) { /* none */ }
    if (!saved || !saved.csrf) { signedOut(''); return; }
    S.session = saved;
    try {
      const s = await api('GET', '/session');
      saveSession(Object.assign(saved, { role: s.role, owner: s.owner, terminal: !!s.terminal }));
      started();
    } catch (e) {
      if (S.session) signedOut(e.message);
    }
  }
  boot();
})();
