// A session's page: status and actions, portal buttons, gauges, and the
// terminal, files, artifacts and log tabs.
import { useEffect, useRef, useState } from 'preact/hooks';
import { Code2, FileDown, Globe, Monitor, NotebookPen, Plus, Trash2, Upload, X, Folder, File, Link2 } from 'lucide-preact';
import { ago, bytes, credits, del, download, enc, get, openPortal, openWS, upload, visible } from './api.js';
import { Actions } from './sessions.jsx';
import { Term } from './terminal.jsx';
import { Confirm, ErrorBox, Gauge, Status, usePoll } from './ui.jsx';

const TABS = [['terminal', 'Terminal'], ['files', 'Files'], ['artifacts', 'Artifacts'], ['logs', 'Log']];

const SESSION_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

export function SessionPage({ me, id, tab }) {
  if (!SESSION_ID.test(id || '')) {
    return <div class="page"><h1>No such session</h1><p class="notice" role="alert">“{visible(id || '')}” is not a session id.</p><p><a href="#/sessions">Back to sessions</a></p></div>;
  }
  return <Session me={me} id={id} tab={tab} />;
}

function Session({ me, id, tab }) {
  const [s, setS] = useState(null);
  // The terminal opens a shell: only once its tab has been shown.
  const [termSeen, setTermSeen] = useState(tab === 'terminal');
  useEffect(() => { if (tab === 'terminal') setTermSeen(true); }, [tab]);
  const [err, setErr] = useState(null);
  const [gone, setGone] = useState(false);
  const canUpdate = me.permissions.includes('project.update');

  async function load() {
    try {
      setS(await get('/v1/sandbox/' + enc(id)));
      setErr(null);
    } catch (e) {
      if (e.status === 404) setGone(true);
      setErr(e);
    }
  }
  usePoll(load, 5000, [id]);

  if (gone) return <div class="page"><h1>{id}</h1><ErrorBox error={err} /><p><a href="#/sessions">Back to sessions</a></p></div>;
  if (!s) return <div class="page"><h1>{id}</h1><ErrorBox error={err} />{!err && <p>Loading…</p>}</div>;
  const running = s.status === 'running';
  return (
    <div class="page session">
      <div class="page-head">
        <div>
          <p class="crumbs"><a href="#/sessions">Sessions</a> /</p>
          <h1>{s.sessionId} <Status s={s.status} /></h1>
          <p class="sub">{s.size} · {s.resources.vcpus} vCPU · {s.resources.memoryMiB / 1024} GiB · {s.resources.diskMiB / 1024} GiB disk · {s.stoppedAt && s.status !== 'running' ? 'stopped ' + ago(s.stoppedAt) : 'started ' + ago(s.startedAt || s.createdAt)} ago{s.statusReason ? ' · ' + s.statusReason : ''}{s.gitRepo ? ' · ' + s.gitRepo + (s.gitBranch ? '@' + s.gitBranch : '') : ''}</p>
        </div>
        {canUpdate && <Actions s={s} onChange={load} onDeleted={() => { location.hash = '#/sessions'; }} />}
      </div>
      <ErrorBox error={err} />
      <div class="panel gauges">
        <Gauge label="Egress" value={s.egress.bytesUsed} max={s.egress.bytesLimit} text={bytes(s.egress.bytesUsed) + ' of ' + bytes(s.egress.bytesLimit)} />
        <Stats id={id} running={running} />
        <div class="kv"><span>Credits used</span><strong id="credits-used">{credits(s.credits.used)}</strong></div>
        <div class="kv"><span>Saved workspace</span><strong>{s.storage && s.storage.savedBytes ? bytes(s.storage.savedBytes) : '–'}</strong></div>
        {s.secretNames && s.secretNames.length > 0 && <div class="kv"><span>Secrets</span><strong>{s.secretNames.join(', ')}</strong></div>}
      </div>
      {canUpdate && <Portal s={s} running={running} />}
      <div class="tabs" role="tablist" aria-label="Session views" onKeyDown={(e) => {
        const i = TABS.findIndex(([k]) => k === tab);
        const j = e.key === 'ArrowRight' ? (i + 1) % TABS.length : e.key === 'ArrowLeft' ? (i + TABS.length - 1) % TABS.length : -1;
        if (j < 0) return;
        e.preventDefault();
        location.hash = '#/s/' + enc(id) + '/' + TABS[j][0];
        setTimeout(() => { const el = document.getElementById('tab-' + TABS[j][0]); el && el.focus(); }, 0);
      }}>
        {TABS.map(([k, label]) => (
          <a role="tab" id={'tab-' + k} aria-selected={tab === k ? 'true' : 'false'} tabindex={tab === k ? '0' : '-1'} href={'#/s/' + enc(id) + '/' + k}>{label}</a>
        ))}
      </div>
      <div role="tabpanel" aria-labelledby={'tab-' + tab}>
        {/* Terminals stay mounted while another tab shows, so they keep their sockets. */}
        <div hidden={tab !== 'terminal'}>
          {!canUpdate ? <p class="notice">Your role ({me.role}) cannot open terminals: that needs <code>project.update</code>.</p>
            : !running ? <p class="notice">The sandbox is {s.status}. Resume it to open a terminal.</p>
              : termSeen && <Terminals sid={id} active={tab === 'terminal'} />}
        </div>
        {tab === 'files' && <Files sid={id} canUpdate={canUpdate} running={running} />}
        {tab === 'artifacts' && <Artifacts sid={id} />}
        {tab === 'logs' && <Logs sid={id} />}
      </div>
    </div>
  );
}

// Stats shows the sandbox's live resource use (GET .../stats).
function Stats({ id, running }) {
  const [st, setSt] = useState(null);
  usePoll(async () => {
    if (!running) { setSt(null); return; }
    try { setSt(await get('/v1/sandbox/' + enc(id) + '/stats')); } catch (_) { setSt(null); }
  }, 5000, [id, running]);
  if (!st) return null;
  return (
    <>
      <Gauge label="Memory" value={st.memory.usedBytes} max={st.memory.limitBytes} text={bytes(st.memory.usedBytes) + ' of ' + bytes(st.memory.limitBytes)} />
      <Gauge label="Disk" value={st.disk.usedBytes} max={st.disk.totalBytes} text={bytes(st.disk.usedBytes) + ' of ' + bytes(st.disk.totalBytes)} />
      <Gauge label="Processes" value={st.pids.current} max={st.pids.limit} text={st.pids.current + ' of ' + st.pids.limit} />
      <div class="kv"><span>CPU time</span><strong>{st.cpu.seconds.toFixed(1)} s</strong></div>
    </>
  );
}

// The portal's services; the browser's is a DevTools endpoint, whose
// version document is the page worth opening.
const PORTAL = [
  ['editor', 'Editor', Code2, 'VS Code in the browser', ''],
  ['notebook', 'Notebook', NotebookPen, 'Jupyter', ''],
  ['display', 'Display', Monitor, 'the virtual display (noVNC)', ''],
  ['browser', 'Browser', Globe, "the headless browser's DevTools endpoint", 'json/version'],
];

function Portal({ s, running }) {
  const [err, setErr] = useState(null);
  return (
    <div class="portal">
      {PORTAL.map(([k, label, Icon, what, sub]) => (
        <button class="small" data-portal={k} disabled={!running} title={'Open ' + what + ' in a new tab, on the sandbox’s own origin'}
          onClick={() => openPortal(s.sessionId, s.urls[k] + sub).catch(setErr)}><Icon size={14} aria-hidden="true" /> {label}</button>
      ))}
      <ErrorBox error={err} onClose={() => setErr(null)} />
    </div>
  );
}

function Terminals({ sid, active }) {
  const key = 'sandboxd.terms.' + sid;
  const [tabs, setTabs] = useState(() => {
    try { return JSON.parse(sessionStorage.getItem(key)) || [{ n: 1, tid: '' }]; } catch (_) { return [{ n: 1, tid: '' }]; }
  });
  const [cur, setCur] = useState(tabs[0].n);
  const [server, setServer] = useState([]);
  useEffect(() => { sessionStorage.setItem(key, JSON.stringify(tabs)); }, [tabs]);
  // Shells of this session that no tab of this page shows (other tabs,
  // other people, closed pages: one ends 10 minutes after its last viewer).
  const loadOthers = () => get('/v1/sandbox/' + enc(sid) + '/terminals').then((r) => setServer(r.terminals)).catch(() => {});
  useEffect(() => { loadOthers(); }, [sid]);
  const others = server.filter((x) => x.running && !tabs.some((t) => t.tid === x.terminalId));
  const attach = (tid) => { const n = Math.max(0, ...tabs.map((t) => t.n)) + 1; setTabs([...tabs, { n, tid }]); setCur(n); };
  const end = (tid) => del('/v1/sandbox/' + enc(sid) + '/terminals/' + enc(tid)).catch(() => {}).finally(loadOthers);
  const add = () => { const n = Math.max(0, ...tabs.map((t) => t.n)) + 1; setTabs([...tabs, { n, tid: '' }]); setCur(n); };
  const close = async (t) => {
    if (t.tid) del('/v1/sandbox/' + enc(sid) + '/terminals/' + enc(t.tid)).catch(() => {});
    const rest = tabs.filter((x) => x.n !== t.n);
    const next = rest.length ? rest : [{ n: t.n + 1, tid: '' }];
    setTabs(next);
    if (cur === t.n) setCur(next[next.length - 1].n);
  };
  return (
    <div class="terminals">
      <div class="term-tabs" role="tablist" aria-label="Terminals">
        {tabs.map((t) => (
          <span class={'term-tabbtn' + (cur === t.n ? ' on' : '')}>
            <button role="tab" aria-selected={cur === t.n ? 'true' : 'false'} onClick={() => setCur(t.n)}>Terminal {t.n}</button>
            <button class="ghost" aria-label={'Close terminal ' + t.n} title="Close (ends its shell)" onClick={() => close(t)}><X size={12} aria-hidden="true" /></button>
          </span>
        ))}
        <button class="ghost small" id="new-terminal" onClick={add} aria-label="New terminal"><Plus size={14} aria-hidden="true" /></button>
        <span class="hint kbd-hint">The terminal keeps Tab for the shell; F6 moves the focus out.</span>
      </div>
      {tabs.map((t) => (
        <Term key={t.n} sid={sid} tid={t.tid} active={active && cur === t.n}
          onReady={(tid) => setTabs((ts) => ts.map((x) => x.n === t.n ? { ...x, tid } : x))}
          onGone={() => setTabs((ts) => ts.map((x) => x.n === t.n ? { ...x, tid: '' } : x))} onLimit={loadOthers} />
      ))}
      {others.length > 0 && <details class="others">
        <summary>{others.length} other shell{others.length > 1 ? 's' : ''} running in this session</summary>
        <ul>{others.map((o) => <li>
          <code>{o.terminalId}</code> <span class="sub">opened {ago(o.createdAt)} ago · {o.viewers} watching</span>
          <button class="small" onClick={() => attach(o.terminalId)}>Attach</button>
          <button class="small danger" onClick={() => end(o.terminalId)}>End</button>
        </li>)}</ul>
      </details>}
    </div>
  );
}

function join(dir, name) { return (dir.endsWith('/') ? dir : dir + '/') + name; }

function Files({ sid, canUpdate, running }) {
  const [dir, setDir] = useState('/workspace');
  const [list, setList] = useState(null);
  const [err, setErr] = useState(null);
  const [ups, setUps] = useState([]);
  const [drag, setDrag] = useState(false);
  const [ask, setAsk] = useState(null);
  const input = useRef();
  const base = '/v1/sandbox/' + enc(sid) + '/files?path=';

  async function load() {
    try {
      const l = await get(base + enc(dir));
      l.sort((a, b) => (a.type === 'dir') === (b.type === 'dir') ? a.name.localeCompare(b.name) : a.type === 'dir' ? -1 : 1);
      setList(l);
      setErr(null);
    } catch (e) { setErr(e); setList([]); }
  }
  useEffect(() => { setList(null); load(); }, [dir]);

  async function send(files) {
    const items = Array.from(files).map((f) => ({ name: f.name, size: f.size, p: 0, err: null }));
    setUps((u) => [...items, ...u]);
    for (const [i, f] of Array.from(files).entries()) {
      const it = items[i];
      try {
        await upload(base + enc(join(dir, f.name)), f, (p) => { it.p = p; setUps((u) => [...u]); });
      } catch (e) { it.err = e; setUps((u) => [...u]); }
    }
    load();
  }
  const parts = dir.split('/').filter(Boolean);
  const allowUp = canUpdate && running;
  return (
    <div class={'files' + (drag ? ' dragging' : '')}
      onDragOver={(e) => { if (!allowUp) return; e.preventDefault(); setDrag(true); }}
      onDragLeave={() => setDrag(false)}
      onDrop={(e) => { if (!allowUp) return; e.preventDefault(); setDrag(false); send(e.dataTransfer.files); }}>
      <div class="files-head">
        <nav class="path" aria-label="Folder">
          {parts.map((p, i) => <>
            <span>/</span><button class="link" onClick={() => setDir('/' + parts.slice(0, i + 1).join('/'))}>{visible(p)}</button>
          </>)}
        </nav>
        {allowUp && <>
          <input ref={input} type="file" multiple hidden id="upload-input" onChange={(e) => { send(e.target.files); e.target.value = ''; }} />
          <button class="small" onClick={() => input.current.click()}><Upload size={14} aria-hidden="true" /> Upload</button>
        </>}
      </div>
      {allowUp && <p class="hint name">Drop files here to upload them into {visible(dir)}.</p>}
      {ups.length > 0 && <ul class="uploads" aria-label="Uploads">
        {ups.map((u) => <li>
          <span class="name">{visible(u.name)}</span>
          {u.err ? <span class="bad">{u.err.message}{u.err.requestId ? ' (request ' + u.err.requestId + ')' : ''}</span>
            : <progress max="1" value={u.p} aria-label={'Upload of ' + u.name}>{Math.round(u.p * 100)}%</progress>}
          <span class="sub">{u.p >= 1 && !u.err ? 'done' : bytes(u.size)}</span>
        </li>)}
      </ul>}
      <ErrorBox error={err} />
      {list === null ? <p>Loading…</p> : (
        <div class="table-wrap"><table class="filelist">
          <thead><tr><th>Name</th><th class="num">Size</th><th>Modified</th><th><span class="sr">Actions</span></th></tr></thead>
          <tbody>
            {dir !== '/workspace' && <tr><td colspan="4"><button class="link" onClick={() => setDir(dir.slice(0, dir.lastIndexOf('/')) || '/')}>..</button></td></tr>}
            {list.length === 0 && <tr><td colspan="4" class="empty">Empty folder.</td></tr>}
            {list.map((f) => (
              <tr data-file={f.name}>
                <td class="name">{f.type === 'dir'
                  ? <button class="link" onClick={() => setDir(join(dir, f.name))}><Folder size={14} aria-hidden="true" /> {visible(f.name)}/</button>
                  : <span>{f.type === 'symlink' ? <Link2 size={14} aria-hidden="true" /> : <File size={14} aria-hidden="true" />} {visible(f.name)}</span>}</td>
                <td class="num">{f.type === 'file' ? bytes(f.size) : ''}</td>
                <td title={f.modifiedAt}>{ago(f.modifiedAt)} ago</td>
                <td><div class="row-actions">
                  {f.type === 'file' && <button class="small" aria-label={'Download ' + visible(f.name)} onClick={() => download(base + enc(join(dir, f.name)), f.name).catch(setErr)}><FileDown size={14} aria-hidden="true" /></button>}
                  {allowUp && <button class="small danger" aria-label={'Delete ' + visible(f.name)} onClick={() => setAsk(f)}><Trash2 size={14} aria-hidden="true" /></button>}
                </div></td>
              </tr>
            ))}
          </tbody>
        </table></div>
      )}
      {ask && <Confirm title="Delete" danger body={'Delete ' + visible(join(dir, ask.name)) + (ask.type === 'dir' ? ' and everything in it' : '') + '?'}
        action={() => del(base + enc(join(dir, ask.name)) + (ask.type === 'dir' ? '&recursive=true' : ''))} onDone={load} onClose={() => setAsk(null)} />}
    </div>
  );
}

function Artifacts({ sid }) {
  const [list, setList] = useState(null);
  const [err, setErr] = useState(null);
  const load = async () => { try { setList(await get('/v1/sandbox/' + enc(sid) + '/artifacts')); setErr(null); } catch (e) { setErr(e); setList([]); } };
  useEffect(() => { load(); }, [sid]);
  return (
    <div class="artifacts">
      <p class="hint">Every file of the workspace, while the sandbox runs and after teardown (from the saved workspace). Downloads are always attachments.</p>
      <button class="small" onClick={load}>Refresh</button>
      <ErrorBox error={err} />
      {list === null ? <p>Loading…</p> : list.length === 0 ? <p class="empty">No files in /workspace.</p> : (
        <div class="table-wrap"><table>
          <thead><tr><th>Path</th><th class="num">Size</th><th>SHA-256</th><th>Modified</th><th><span class="sr">Download</span></th></tr></thead>
          <tbody>{list.map((a) => (
            <tr data-artifact={a.path}>
              <td class="name">{visible(a.path)}</td><td class="num">{bytes(a.size)}</td>
              <td><code class="sha" title={a.sha256}>{a.sha256.slice(0, 12)}…</code></td>
              <td title={a.modifiedAt}>{ago(a.modifiedAt)} ago</td>
              <td><button class="small" aria-label={'Download ' + visible(a.path)} onClick={() => download('/v1/sandbox/' + enc(sid) + '/artifacts/' + a.path.split('/').map(enc).join('/'), a.path.split('/').pop()).catch(setErr)}><FileDown size={14} aria-hidden="true" /> Download</button></td>
            </tr>))}</tbody>
        </table></div>
      )}
    </div>
  );
}

// Events a reader should not miss: refusals and failures in red, limits
// reached (the sandbox or its output held back or stopped) in amber.
const HOT = {
  egress_denied: 'denied', oom: 'denied', pause_failed: 'denied', resume_failed: 'denied', restore_failed: 'denied',
  save_failed: 'denied', git_clone_failed: 'denied',
  quota_exceeded: 'quota', credits_exhausted: 'quota', disk_pressure: 'quota', scrub_throttled: 'quota',
};

function describe(ev) {
  const rest = { ...ev };
  delete rest.type; delete rest.time; delete rest.kind;
  return Object.entries(rest).filter(([, v]) => v !== '' && v != null).map(([k, v]) => visible(k) + '=' + visible(typeof v === 'string' ? v : JSON.stringify(v))).join(' ');
}

function Logs({ sid }) {
  const [lines, setLines] = useState([]);
  const [state, setState] = useState('connecting');
  const [kernel, setKernel] = useState(true);
  const [follow, setFollow] = useState(true);
  const box = useRef();
  useEffect(() => {
    let ws, stop = false, timer, retry = 0;
    const connect = () => {
      ws = openWS('/v1/sandbox/' + enc(sid) + '/logs/ws');
      ws.onopen = () => { setState('live'); retry = 0; setLines([]); };
      ws.onmessage = (m) => {
        if (typeof m.data !== 'string') return;
        let e;
        try { e = JSON.parse(m.data); } catch (_) { return; }
        if (e.type !== 'kernel' && e.type !== 'event' && e.type !== 'service') return;
        setLines((l) => { const n = l.length >= 2000 ? l.slice(-1999) : l.slice(); n.push(e); return n; });
      };
      ws.onclose = () => {
        if (stop) return;
        setState('reconnecting');
        timer = setTimeout(connect, Math.min(1000 * 2 ** retry++, 10000));
      };
    };
    connect();
    return () => { stop = true; clearTimeout(timer); ws && ws.close(); };
  }, [sid]);
  useEffect(() => { if (follow && box.current) box.current.scrollTop = box.current.scrollHeight; }, [lines, follow]);
  const shown = lines.filter((e) => kernel || e.type === 'event');
  return (
    <div class="logs">
      <div class="filters">
        <span class={'term-state ts-' + (state === 'live' ? 'connected' : 'reconnecting')}><span class="dot" aria-hidden="true" />{state}</span>
        <label class="check"><input type="checkbox" checked={kernel} onChange={(e) => setKernel(e.target.checked)} /> gVisor kernel and service output</label>
        <label class="check"><input type="checkbox" checked={follow} onChange={(e) => setFollow(e.target.checked)} /> Follow</label>
      </div>
      <div class="logbox" ref={box} tabindex="0" aria-label="Session log" role="log">
        {shown.length === 0 && <div class="empty">Nothing logged yet.</div>}
        {shown.map((e) => e.type !== 'event'
          ? <div class={'ll ' + e.type}><time>{(e.time || '').slice(11, 19)}</time> <span class="tag">{e.type === 'kernel' ? 'kernel' : e.service || 'service'}</span> {visible(e.line || '')}</div>
          : <div class={'ll event ' + (HOT[e.kind] || '')} data-kind={e.kind}><time>{e.time.slice(11, 19)}</time> <span class="tag">{visible(e.kind)}</span> {describe(e)}</div>)}
      </div>
    </div>
  );
}
