// The organization's views: usage and credits, tokens, members, audit.
import { useEffect, useRef, useState } from 'preact/hooks';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import { ago, bytes, credits, del, enc, get, post, api } from './api.js';
import { Confirm, ErrorBox, Modal, Status } from './ui.jsx';

export function Usage({ me }) {
  const [period, setPeriod] = useState('current');
  const [u, setU] = useState(null);
  const [err, setErr] = useState(null);
  useEffect(() => { setU(null); get('/v1/usage?period=' + enc(period)).then((r) => { setU(r); setErr(null); }).catch(setErr); }, [period]);
  return (
    <div class="page">
      <div class="page-head">
        <h1>Usage and credits</h1>
        <label>Period <select id="usage-period" value={period} onChange={(e) => setPeriod(e.target.value)}>
          <option value="current">this period</option><option value="previous">previous period</option>
        </select></label>
      </div>
      <ErrorBox error={err} />
      {!u ? !err && <p>Loading…</p> : <>
        <div class="cards">
          <div class="card" id="plan-card"><span>Plan</span><strong>{u.plan.name}</strong>
            <small>{credits(u.plan.monthlyCredits)} credits a month · up to {u.plan.largestSize || 'any size'} · {u.plan.maxConcurrent} at once · {u.plan.pause ? 'pause with memory' : 'no pause'}{u.plan.storageMiB ? ' · ' + bytes(u.plan.storageMiB * 1048576) + ' saved' : ''}</small></div>
          <div class="card"><span>Used</span><strong id="credits-used-total">{credits(u.used.credits)}</strong><small>of {credits(u.allowance.credits + u.granted.credits)} ({credits(u.granted.credits)} granted)</small></div>
          <div class="card"><span>Remaining</span><strong id="credits-remaining">{credits(u.remaining.credits)}</strong><small>{u.period.start.slice(0, 10)} to {u.period.end.slice(0, 10)}</small></div>
        </div>
        <h2>Credits per day</h2>
        <Chart days={u.days} period={u.period} />
        <h2>Sessions</h2>
        {u.sessions.length === 0 ? <p class="empty">No usage in this period.</p> : (
          <div class="table-wrap"><table>
            <thead><tr><th>Session</th><th>Status</th><th>Size</th><th class="num">Running</th><th class="num">Credits</th><th class="num">Egress</th><th class="num">Saved</th></tr></thead>
            <tbody>{u.sessions.map((s) => <tr>
              <td>{s.status === 'deleted' ? s.sessionId : <a href={'#/s/' + enc(s.sessionId)}>{s.sessionId}</a>}</td><td><Status s={s.status} /></td><td>{s.size}</td>
              <td class="num">{(s.runningSeconds / 3600).toFixed(2)} h</td><td class="num">{credits(s.credits.credits)}</td>
              <td class="num">{bytes(s.egressBytes)}</td><td class="num">{s.savedBytes ? bytes(s.savedBytes) : '–'}</td></tr>)}</tbody>
          </table></div>
        )}
      </>}
    </div>
  );
}

// Chart draws credits per day over the whole period (days without use are
// zero), so one busy day does not stretch the axis.
function Chart({ days, period }) {
  const el = useRef();
  useEffect(() => {
    if (!el.current) return;
    const by = Object.fromEntries(days.map((d) => [d.date, d.credits.credits]));
    const xs = [], ys = [];
    const end = Date.parse(period.end);
    for (let t = Date.parse(period.start.slice(0, 10) + 'T00:00:00Z'); t < end && xs.length < 62; t += 86400000) {
      xs.push(t / 1000);
      ys.push(by[new Date(t).toISOString().slice(0, 10)] || 0);
    }
    const width = () => Math.max(280, el.current.clientWidth);
    const bars = uPlot.paths.bars({ size: [0.6, 40] });
    const plot = new uPlot({
      width: width(), height: 220,
      scales: { x: { time: true, range: [xs[0] - 43200, xs[xs.length - 1] + 43200] }, y: { range: (u, lo, hi) => [0, Math.max(1, hi * 1.15)] } },
      axes: [{ stroke: '#8b949e', grid: { stroke: '#30363d' } }, { stroke: '#8b949e', grid: { stroke: '#30363d' }, label: 'credits' }],
      series: [{}, { label: 'Credits', stroke: '#58a6ff', fill: 'rgba(88,166,255,0.35)', paths: bars, points: { show: false } }],
      legend: { show: false },
    }, [xs, ys], el.current);
    const ro = new ResizeObserver(() => plot.setSize({ width: width(), height: 220 }));
    ro.observe(el.current);
    return () => { ro.disconnect(); plot.destroy(); };
  }, [days, period]);
  if (days.length === 0) return <p class="empty">No credits drawn in this period yet.</p>;
  return <div class="chart" ref={el} role="img" aria-label={'Credits per day: ' + days.map((d) => d.date + ' ' + credits(d.credits.credits)).join(', ')} />;
}

export function Tokens({ me }) {
  const [list, setList] = useState(null);
  const [err, setErr] = useState(null);
  const [name, setName] = useState('');
  const [fresh, setFresh] = useState(null);
  const [ask, setAsk] = useState(null);
  const [all, setAll] = useState(false);
  const manage = me.permissions.includes('org.manage');
  const load = async () => { try { setList((await get('/v1/tokens' + (all ? '?all=true' : ''))).tokens); setErr(null); } catch (e) { setErr(e); } };
  useEffect(() => { load(); }, [all]);
  async function create(e) {
    e.preventDefault();
    try { setFresh(await post('/v1/tokens', { name: name.trim() })); setName(''); load(); } catch (x) { setErr(x); }
  }
  return (
    <div class="page">
      <div class="page-head"><h1>API tokens</h1>
        {manage && <label><input type="checkbox" checked={all} onChange={(e) => setAll(e.target.checked)} /> everyone's</label>}</div>
      <form class="inline" onSubmit={create}>
        <label for="tok-name">New token named</label>
        <input id="tok-name" value={name} onInput={(e) => setName(e.target.value)} placeholder="ci-runner" required />
        <button class="primary" type="submit" id="tok-create">Create</button>
      </form>
      <ErrorBox error={err} onClose={() => setErr(null)} />
      {list && <div class="table-wrap"><table>
        <thead><tr><th>Name</th><th>Created</th><th>Last used</th><th>State</th><th><span class="sr">Actions</span></th></tr></thead>
        <tbody>{list.map((t) => (
          <tr data-token={t.name}>
            <td>{t.name}{t.id === me.tokenId && <span class="pill">this tab</span>}{all && <div class="sub">{t.userId}</div>}</td>
            <td title={t.createdAt}>{ago(t.createdAt)} ago</td><td>{t.lastUsedAt ? ago(t.lastUsedAt) + ' ago' : 'never'}</td>
            <td>{t.revokedAt ? <span class="status st-stopped">revoked</span> : <span class="status st-running">active</span>}</td>
            <td>{!t.revokedAt && <button class="small danger" data-revoke={t.name} onClick={() => setAsk(t)}>Revoke</button>}</td>
          </tr>))}</tbody>
      </table></div>}
      {fresh && <Modal title="Token created" onClose={() => setFresh(null)}>
        <p>Copy it now: this is the only time it is shown. It is stored only as a hash.</p>
        <input class="secret" id="fresh-token" readOnly value={fresh.token} onFocus={(e) => e.target.select()} aria-label="The new token" />
        <div class="actions"><CopyButton target="fresh-token" /><button class="primary" onClick={() => setFresh(null)}>Done</button></div>
      </Modal>}
      {ask && <Confirm title="Revoke" danger body={'Revoke the token “' + ask.name + '”? Whatever uses it stops working at once' + (ask.id === me.tokenId ? ', including this tab: you will be signed out.' : '.')}
        action={() => del('/v1/tokens/' + enc(ask.id))} onDone={load} onClose={() => setAsk(null)} />}
    </div>
  );
}

const ROLES = ['owner', 'admin', 'developer', 'viewer'];

export function Members({ me }) {
  const [list, setList] = useState(null);
  const [err, setErr] = useState(null);
  const [name, setName] = useState('');
  const [role, setRole] = useState('developer');
  const [fresh, setFresh] = useState(null);
  const [ask, setAsk] = useState(null);
  const base = '/v1/orgs/' + enc(me.organization.id) + '/members';
  const load = async () => { try { setList((await get(base)).members); } catch (e) { setErr(e); } };
  useEffect(() => { load(); }, []);
  async function add(e) {
    e.preventDefault();
    setErr(null);
    try { setFresh(await post(base, { name: name.trim(), role })); setName(''); load(); } catch (x) { setErr(x); }
  }
  const [askRole, setAskRole] = useState(null);
  async function change(m, r) {
    if (m.userId === me.user.id) { setAskRole({ m, r }); return; } // asked first: see below
    setErr(null);
    try { await api('PATCH', base + '/' + enc(m.userId), { role: r }); } catch (x) { setErr(x); }
    load(); // the select shows the role the server has
  }
  return (
    <div class="page">
      <h1>Members of {me.organization.name}</h1>
      <form class="inline" onSubmit={add}>
        <label for="m-name">Add</label>
        <input id="m-name" value={name} onInput={(e) => setName(e.target.value)} placeholder="name" required />
        <label for="m-role" class="sr">Role</label>
        <select id="m-role" value={role} onChange={(e) => setRole(e.target.value)}>{ROLES.map((r) => <option>{r}</option>)}</select>
        <button class="primary" type="submit">Add member</button>
      </form>
      <ErrorBox error={err} onClose={() => setErr(null)} />
      {list && <div class="table-wrap"><table>
        <thead><tr><th>Name</th><th>Role</th><th>Since</th><th><span class="sr">Actions</span></th></tr></thead>
        <tbody>{list.map((m) => (
          <tr data-member={m.name}>
            <td>{m.name}{m.userId === me.user.id && <span class="pill">you</span>}</td>
            <td><select aria-label={'Role of ' + m.name} value={m.role} onChange={(e) => change(m, e.target.value)}>{ROLES.map((r) => <option>{r}</option>)}</select></td>
            <td>{ago(m.createdAt)} ago</td>
            <td><button class="small danger" onClick={() => setAsk(m)}>Remove</button></td>
          </tr>))}</tbody>
      </table></div>}
      {fresh && <Modal title="Member added" onClose={() => setFresh(null)}>
        <p>{fresh.user.name} is a {fresh.role}. Give them this token; it is shown only now.</p>
        <input class="secret" id="member-token" readOnly value={fresh.token && fresh.token.token} onFocus={(e) => e.target.select()} aria-label="Their token" />
        <div class="actions"><CopyButton target="member-token" /><button class="primary" onClick={() => setFresh(null)}>Done</button></div>
      </Modal>}
      {askRole && <Confirm title="Change my role" danger body={'Make yourself ' + askRole.r + '? You lose what ' + me.role + ' allows at once' + (askRole.r === 'owner' || askRole.r === 'admin' ? '.' : ', this page included.')}
        action={() => api('PATCH', base + '/' + enc(askRole.m.userId), { role: askRole.r })}
        onDone={() => { dispatchEvent(new Event('sandboxd-refresh-me')); load(); }} onClose={() => { setAskRole(null); load(); }} />}
      {ask && <Confirm title="Remove" danger body={'Remove ' + ask.name + ' from ' + me.organization.name + '? Their tokens stop working.'}
        action={() => del(base + '/' + enc(ask.userId))} onDone={load} onClose={() => setAsk(null)} />}
    </div>
  );
}

// copy puts text on the clipboard (the async API exists only on secure
// origins; plain http on a LAN address falls back to a selection copy).
async function copy(input) {
  try {
    await navigator.clipboard.writeText(input.value);
    return true;
  } catch (_) {
    input.focus();
    input.select();
    return document.execCommand && document.execCommand('copy');
  }
}

function CopyButton({ target }) {
  const [done, setDone] = useState('');
  return <button onClick={async () => setDone(await copy(document.getElementById(target)) ? 'Copied' : 'Select it and copy by hand')}>{done || 'Copy'}</button>;
}

function localToRFC(v) { return v ? new Date(v).toISOString().replace(/\.\d{3}Z$/, 'Z') : ''; }

export function Audit({ me }) {
  const [f, setF] = useState({ sessionId: '', userId: '', action: '', since: '', until: '' });
  const [recs, setRecs] = useState(null);
  const [err, setErr] = useState(null);
  const [members, setMembers] = useState([]);
  const PAGE = 200;
  const [more, setMore] = useState(false);
  // load fetches the newest PAGE records that match; older appends the
  // PAGE before the oldest shown.
  async function load(e, older) {
    e && e.preventDefault();
    const q = new URLSearchParams({ limit: String(PAGE) });
    for (const k of ['sessionId', 'userId', 'action']) if (f[k].trim()) q.set(k, f[k].trim());
    if (f.since) q.set('since', localToRFC(f.since));
    let until = f.until ? localToRFC(f.until) : '';
    if (older && recs && recs.length) until = recs[recs.length - 1].time; // exclusive; times are in nanoseconds
    if (until) q.set('until', until);
    try {
      const got = (await get('/v1/audit?' + q)).records;
      setMore(got.length === PAGE);
      if (older) {
        const seen = new Set(recs.map((r) => r.requestId + r.action + r.time));
        setRecs([...recs, ...got.filter((r) => !seen.has(r.requestId + r.action + r.time))]);
      } else setRecs(got);
      setErr(null);
    } catch (x) { setErr(x); }
  }
  useEffect(() => {
    load();
    if (me.permissions.includes('org.manage')) get('/v1/orgs/' + enc(me.organization.id) + '/members').then((r) => setMembers(r.members)).catch(() => {});
  }, []);
  const names = Object.fromEntries(members.map((m) => [m.userId, m.name]));
  const set = (k) => (e) => setF({ ...f, [k]: e.target.value });
  return (
    <div class="page">
      <h1>Audit log</h1>
      <form class="filters" onSubmit={load} role="search">
        <label>Session <input id="a-session" value={f.sessionId} onInput={set('sessionId')} /></label>
        <label>User <select id="a-user" value={f.userId} onChange={set('userId')}><option value="">anyone</option>{members.map((m) => <option value={m.userId}>{m.name}</option>)}</select></label>
        <label>Action <input id="a-action" value={f.action} onInput={set('action')} placeholder="sandbox.provision" /></label>
        <label>From <input type="datetime-local" value={f.since} onInput={set('since')} /></label>
        <label>To <input type="datetime-local" value={f.until} onInput={set('until')} /></label>
        <button class="primary" type="submit">Filter</button>
      </form>
      <ErrorBox error={err} />
      {recs && (recs.length === 0 ? <p class="empty">No records match.</p> : <div class="table-wrap"><table class="audit">
        <thead><tr><th>Time</th><th>User</th><th>Action</th><th>Session</th><th>Outcome</th><th>Request</th><th>Details</th></tr></thead>
        <tbody>{recs.map((r) => (
          <tr data-action={r.action}>
            <td title={r.time}>{r.time.replace('T', ' ').slice(0, 19)}</td><td>{names[r.userId] || r.userId || '–'}</td>
            <td><code>{r.action}</code></td><td>{r.sessionId ? <a href={'#/s/' + enc(r.sessionId)}>{r.sessionId}</a> : '–'}</td>
            <td><span class={'status ' + (r.outcome === 'ok' ? 'st-running' : r.outcome === 'denied' ? 'st-failed' : 'st-paused')}>{r.outcome}</span> {r.status}</td>
            <td><code class="sub">{r.requestId}</code></td>
            <td class="details">{r.details ? JSON.stringify(r.details) : ''}</td>
          </tr>))}</tbody>
      </table></div>)}
      {more && <p><button onClick={() => load(null, true)}>Load older records</button></p>}
    </div>
  );
}
