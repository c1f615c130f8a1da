// The sessions list, provisioning, and the lifecycle actions.
import { useEffect, useState } from 'preact/hooks';
import { Plus, RefreshCw } from 'lucide-preact';
import { ago, bytes, credits, del, enc, get, post } from './api.js';
import { Confirm, ErrorBox, Modal, Status, usePoll } from './ui.jsx';

const STATUSES = ['', 'running', 'paused', 'provisioning', 'stopping', 'stopped', 'failed'];

export function Sessions({ me }) {
  const [list, setList] = useState(null);
  const [err, setErr] = useState(null);
  const [status, setStatus] = useState('');
  const [q, setQ] = useState('');
  const [creating, setCreating] = useState(false);
  const [now, setNow] = useState(Date.now());
  const canUpdate = me.permissions.includes('project.update');

  async function load() {
    try {
      const r = await get('/v1/sandbox' + (status ? '?status=' + enc(status) : ''));
      setList(r.sandboxes);
      setNow(Date.now());
      setErr(null);
    } catch (e) { setErr(e); }
  }
  usePoll(load, 5000, [status]);

  const shown = (list || []).filter((s) => !q || s.sessionId.toLowerCase().includes(q.toLowerCase()));
  return (
    <div class="page">
      <div class="page-head">
        <h1>Sessions</h1>
        <div class="tools">
          <button class="ghost" onClick={load} aria-label="Refresh"><RefreshCw size={16} aria-hidden="true" /></button>
          {canUpdate && <button class="primary" id="new-sandbox" onClick={() => setCreating(true)}><Plus size={16} aria-hidden="true" /> New sandbox</button>}
        </div>
      </div>
      {!canUpdate && <p class="notice" id="viewer-note">Your role ({me.role}) can look at sessions but not start or change them.</p>}
      <div class="filters" role="search">
        <label>Status <select id="filter-status" value={status} onChange={(e) => setStatus(e.target.value)}>
          {STATUSES.map((s) => <option value={s}>{s || 'any'}</option>)}
        </select></label>
        <label>Session <input id="filter-q" type="search" value={q} onInput={(e) => setQ(e.target.value)} placeholder="filter by id" /></label>
      </div>
      <ErrorBox error={err} />
      {list === null ? <p>Loading…</p> : shown.length === 0 ? (
        <p class="empty">{list.length === 0 ? 'No sessions yet.' + (canUpdate ? ' Start one with “New sandbox”.' : '') : 'No session matches the filter.'}</p>
      ) : (
        <div class="table-wrap">
          <table class="sessions">
            <thead><tr><th>Session</th><th>Status</th><th>Size</th><th>Age</th><th class="num">Credits</th><th>Egress</th><th class="num">Saved</th><th><span class="sr">Actions</span></th></tr></thead>
            <tbody>
              {shown.map((s) => (
                <tr data-session={s.sessionId}>
                  <td><a href={'#/s/' + enc(s.sessionId)}>{s.sessionId}</a>{s.gitRepo && <div class="sub">{s.gitRepo}{s.gitBranch ? ' @ ' + s.gitBranch : ''}</div>}</td>
                  <td><Status s={s.status} />{s.statusReason && <div class="sub">{s.statusReason}</div>}</td>
                  <td>{s.size}<div class="sub">{s.resources.vcpus} vCPU · {s.resources.memoryMiB / 1024} GiB</div></td>
                  <td title={s.createdAt}>{ago(s.createdAt, now)}</td>
                  <td class="num">{credits(s.credits.used)}</td>
                  <td>{bytes(s.egress.bytesUsed)} <span class="sub">of {bytes(s.egress.bytesLimit)}</span></td>
                  <td class="num">{s.storage && s.storage.savedBytes ? bytes(s.storage.savedBytes) : '–'}</td>
                  <td>{canUpdate && <Actions s={s} onChange={load} />}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      {creating && <Provision me={me} onClose={() => setCreating(false)} onDone={(s) => { setCreating(false); location.hash = '#/s/' + enc(s.sessionId); }} />}
    </div>
  );
}

// Actions are the lifecycle buttons a session's status allows, each
// confirmed first.
export function Actions({ s, onChange, onDeleted }) {
  const [ask, setAsk] = useState(null);
  const id = enc(s.sessionId);
  const acts = [];
  if (s.status === 'running') {
    acts.push({ name: 'Pause', body: 'Pause ' + s.sessionId + ' with its memory? Its processes stop until you resume it; it draws no credits meanwhile.', run: () => post('/v1/sandbox/' + id + '/pause') });
    acts.push({ name: 'Teardown', body: 'Tear down ' + s.sessionId + '? Its workspace is saved to storage and the sandbox stops; running processes end. Resume brings the files back.', run: () => post('/v1/sandbox/' + id + '/teardown') });
  }
  if (s.status === 'stopped' || s.status === 'paused' || s.status === 'failed') {
    acts.push({ name: 'Resume', body: 'Resume ' + s.sessionId + '? It starts again with its saved workspace.', run: () => post('/v1/sandbox/' + id + '/resume'), primary: true });
  }
  if (s.status !== 'deleted') {
    acts.push({ name: 'Delete', body: 'Delete ' + s.sessionId + ' for good? The sandbox stops and its saved workspace is removed. This cannot be undone.', run: () => del('/v1/sandbox/' + id), danger: true, deleted: true });
  }
  return (
    <div class="row-actions">
      {acts.map((a) => <button class={a.danger ? 'danger small' : 'small'} data-action={a.name.toLowerCase()} onClick={() => setAsk(a)}>{a.name}</button>)}
      {ask && <Confirm title={ask.name} body={ask.body} danger={ask.danger} action={ask.run}
        onDone={() => { if (ask.deleted && onDeleted) onDeleted(); else onChange && onChange(); }} onClose={() => setAsk(null)} />}
    </div>
  );
}

function suggestId() {
  const d = new Date();
  const p = (n) => String(n).padStart(2, '0');
  const r = Array.from(crypto.getRandomValues(new Uint8Array(3)), (b) => b.toString(16).padStart(2, '0')).join('');
  return 's-' + d.getFullYear() + p(d.getMonth() + 1) + p(d.getDate()) + '-' + r;
}

const ID_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
const REPO_RE = /^[A-Za-z0-9][A-Za-z0-9-]{0,38}\/[A-Za-z0-9._-]{1,100}$/;

function parseEnv(text) {
  const env = {};
  for (const [i, raw] of text.split('\n').entries()) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    const eq = line.indexOf('=');
    if (eq < 1) throw new Error('Environment, line ' + (i + 1) + ': write NAME=value.');
    const name = line.slice(0, eq).trim();
    if (name in env) throw new Error('Environment, line ' + (i + 1) + ': ' + name + ' is given twice.');
    env[name] = line.slice(eq + 1);
  }
  return env;
}

const MAX_IDLE_MIN = 7 * 24 * 60; // the API's cap, a week

function Provision({ me, onClose, onDone }) {
  const [sizes, setSizes] = useState(null);
  const [id, setId] = useState(suggestId());
  const [size, setSize] = useState('');
  const [repo, setRepo] = useState('');
  const [branch, setBranch] = useState('');
  const [envText, setEnvText] = useState('');
  const [secrets, setSecrets] = useState([{ name: '', value: '' }]);
  const [idle, setIdle] = useState('');
  const [err, setErr] = useState(null);
  const [busy, setBusy] = useState(false);

  useEffect(() => {
    get('/v1/sizes').then((r) => { setSizes(r); setSize(r.default); }).catch(setErr);
  }, []);

  const idBad = id.trim() !== '' && !ID_RE.test(id.trim());
  const repoBad = repo && !REPO_RE.test(repo);
  const noGit = repo && !me.github.connected;

  async function submit(e) {
    e.preventDefault();
    setErr(null);
    const body = { sessionId: id.trim(), size };
    try {
      if (repo) { body.gitRepo = repo.trim(); if (branch) body.gitBranch = branch.trim(); }
      const env = parseEnv(envText);
      if (Object.keys(env).length) body.env = env;
      const sec = {};
      for (const s of secrets) {
        const n = s.name.trim();
        if (!n) { if (s.value) throw new Error('Secrets: a value needs a name.'); continue; }
        if (n in sec) throw new Error('Secrets: ' + n + ' is given twice.');
        sec[n] = s.value;
      }
      if (Object.keys(sec).length) body.secrets = sec;
      if (idle.trim()) {
        const m = Number(idle);
        if (!Number.isInteger(m) || m < 1 || m > MAX_IDLE_MIN) throw new Error('Idle timeout: a whole number of minutes from 1 to ' + MAX_IDLE_MIN + ' (a week), or empty for none.');
        body.idleTimeoutSeconds = m * 60;
      }
    } catch (x) {
      setErr({ message: x.message, code: 'invalid_request' });
      return;
    }
    setBusy(true);
    try {
      const s = await post('/v1/sandbox', body);
      setSecrets([{ name: '', value: '' }]); // never kept once sent
      onDone(s);
    } catch (x) {
      setErr(x);
      setBusy(false);
    }
  }

  return (
    <Modal title="New sandbox" onClose={onClose} wide>
      <form class="form" onSubmit={submit} id="provision-form" noValidate>
        <label for="p-id">Session id</label>
        <input id="p-id" value={id} onInput={(e) => setId(e.target.value)} aria-invalid={idBad ? 'true' : undefined} aria-describedby="p-id-help" />
        <small id="p-id-help" class={idBad ? 'bad' : ''}>1–128 letters, digits, “.”, “_” or “-”, starting with a letter or digit. A session id is used once; resume an old session instead of reusing its id.</small>

        <fieldset>
          <legend>Size</legend>
          {!sizes ? <p>Loading sizes…</p> : (
            <div class="sizes">
              {sizes.sizes.map((z) => (
                <label class={'size' + (z.allowed ? '' : ' off') + (size === z.name ? ' on' : '')} title={z.allowed ? '' : 'Not on the ' + sizes.plan + ' plan'}>
                  <input type="radio" name="size" value={z.name} checked={size === z.name} disabled={!z.allowed} onChange={() => setSize(z.name)} />
                  <span class="size-name">{z.name}</span>
                  <span class="size-res">{z.vcpus} vCPU · {z.memoryMiB >= 1024 ? z.memoryMiB / 1024 + ' GiB' : z.memoryMiB + ' MiB'} · {z.diskMiB / 1024} GiB disk</span>
                  <span class="size-rate">{credits(z.creditsPerHour.credits)} credits/h</span>
                  {!z.allowed && <span class="size-note">not on the {sizes.plan} plan</span>}
                </label>
              ))}
            </div>
          )}
        </fieldset>

        <details>
          <summary>Repository, environment, secrets, idle timeout</summary>
          <div class="grid2">
            <div>
              <label for="p-repo">GitHub repository (optional)</label>
              <input id="p-repo" value={repo} onInput={(e) => setRepo(e.target.value)} placeholder="owner/name" aria-invalid={repoBad ? 'true' : undefined} />
            </div>
            <div>
              <label for="p-branch">Branch</label>
              <input id="p-branch" value={branch} onInput={(e) => setBranch(e.target.value)} placeholder="default branch" disabled={!repo} />
            </div>
          </div>
          {repoBad && <small class="bad">Write the repository as owner/name.</small>}
          {noGit && <p class="notice" id="no-git">No GitHub credential is connected for {me.user.name}: the clone needs one. Connect it with <code>PUT /v1/me/github</code>, then provision.</p>}
          <label for="p-env">Environment (NAME=value, one per line)</label>
          <textarea id="p-env" rows="3" value={envText} onInput={(e) => setEnvText(e.target.value)} spellcheck="false" />
          <div class="secrets">
            <span class="label">Secrets (given as environment variables, redacted from output, never shown again)</span>
            {secrets.map((s, i) => (
              <div class="secret-row">
                <input aria-label={'Secret ' + (i + 1) + ' name'} placeholder="NAME" value={s.name} onInput={(e) => setSecrets(secrets.map((x, j) => j === i ? { ...x, name: e.target.value } : x))} />
                <input aria-label={'Secret ' + (i + 1) + ' value'} type="password" autocomplete="off" placeholder="value" value={s.value} onInput={(e) => setSecrets(secrets.map((x, j) => j === i ? { ...x, value: e.target.value } : x))} />
              </div>
            ))}
            <button type="button" class="small" onClick={() => setSecrets([...secrets, { name: '', value: '' }])}>Add a secret</button>
          </div>
          <label for="p-idle">Idle timeout (minutes, optional)</label>
          <input id="p-idle" inputMode="numeric" value={idle} onInput={(e) => setIdle(e.target.value)} placeholder="none" />
        </details>

        <ErrorBox error={err} />
        <div class="actions">
          <button type="button" onClick={onClose} disabled={busy}>Cancel</button>
          <button type="submit" class="primary" id="p-submit" disabled={busy || idBad || !id.trim() || !size}>{busy ? 'Starting…' : 'Start sandbox'}</button>
        </div>
      </form>
    </Modal>
  );
}
