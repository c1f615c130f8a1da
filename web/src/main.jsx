// The sandboxd console: sign in with a token, then sessions, a session's
// page and the organization's views. Routes live in the URL's fragment.
import './cspstyles.js'; // first: before xterm.js makes its style elements
import { Component, render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { Boxes, Building2, KeyRound, LogOut, ScrollText, Users, BarChart3 } from 'lucide-preact';
import { ApiError, get, setUnauthenticatedHandler, token } from './api.js';
import { ErrorBox } from './ui.jsx';
import { Sessions } from './sessions.jsx';
import { SessionPage } from './session.jsx';
import { Audit, Members, Tokens, Usage } from './org.jsx';
import './style.css';

function useRoute() {
  const [h, setH] = useState(location.hash);
  useEffect(() => {
    const f = () => setH(location.hash);
    addEventListener('hashchange', f);
    return () => removeEventListener('hashchange', f);
  }, []);
  return h.replace(/^#\/?/, '').split('/').map((p) => { try { return decodeURIComponent(p); } catch (_) { return '(a malformed link)'; } });
}

// Boundary keeps one page's failure from blanking the console; it resets
// when the route changes.
class Boundary extends Component {
  componentDidCatch(err) { this.setState({ err }); }
  componentDidUpdate(prev) { if (prev.route !== this.props.route && this.state.err) this.setState({ err: null }); }
  render() {
    if (this.state.err) {
      return <div class="page"><h1>This page failed</h1><p class="error" role="alert">{String(this.state.err.message || this.state.err)}</p>
        <p><a href="#/sessions">Sessions</a> · <button class="link" onClick={() => location.reload()}>Reload</button></p></div>;
    }
    return this.props.children;
  }
}

function SignIn({ notice }) {
  const [val, setVal] = useState('');
  const [err, setErr] = useState(null);
  const [busy, setBusy] = useState(false);
  async function submit(e) {
    e.preventDefault();
    const t = val.trim().replace(/^bearer\s+/i, '');
    if (!t) { setErr(new ApiError(0, 'invalid_request', 'Paste a token first.', '')); return; }
    if (/[^\x21-\x7e]/.test(t)) {
      setErr(new ApiError(0, 'invalid_request', 'A token is plain ASCII (sbx_…) with no spaces: check for a stray character from copying.', ''));
      return;
    }
    setBusy(true);
    setErr(null);
    try {
      const me = await get('/v1/me', { token: t });
      token.set(t);
      setVal('');
      window.dispatchEvent(new CustomEvent('sandboxd-signin', { detail: me }));
    } catch (e) {
      setErr(e.status === 401 ? new ApiError(401, e.code, 'That token is not valid: unknown, revoked or mistyped.', e.requestId) : e);
    } finally {
      setBusy(false);
    }
  }
  return (
    <main class="signin">
      <form onSubmit={submit} aria-labelledby="signin-title">
        <h1 id="signin-title"><img src="/assets/icon.svg" alt="" width="32" height="32" /> sandboxd</h1>
        <p>Sign in with an API token. It is kept only in this browser tab and is forgotten when you sign out or close the tab. Sandbox pages you open from here (editor, notebook, …) stay signed in to their sandbox for up to 12 hours, or until the token is revoked: on a shared computer, revoke it (Tokens) rather than only signing out.</p>
        {notice && <p class="notice" role="status">{notice}</p>}
        <label for="token">API token</label>
        <input id="token" name="token" type="password" autocomplete="off" spellcheck="false" value={val}
          onInput={(e) => setVal(e.target.value)} placeholder="sbx_…" autofocus />
        <ErrorBox error={err} />
        <button class="primary" type="submit" disabled={busy}>{busy ? 'Checking…' : 'Sign in'}</button>
        <p class="hint">The server's first start wrote the owner's token to <code>owner.token</code> in its data dir (by default <code>/var/lib/sandboxd/owner.token</code>); <code>sandboxd token create</code> makes more.</p>
      </form>
    </main>
  );
}

const NAV = [
  { path: 'sessions', label: 'Sessions', icon: Boxes },
  { path: 'usage', label: 'Usage', icon: BarChart3 },
  { path: 'tokens', label: 'Tokens', icon: KeyRound },
  { path: 'members', label: 'Members', icon: Users, perm: 'org.manage' },
  { path: 'audit', label: 'Audit log', icon: ScrollText, perm: 'audit.read' },
];

function Shell({ me, signOut }) {
  const route = useRoute();
  const can = (p) => !p || me.permissions.includes(p);
  let page;
  switch (route[0]) {
    case '':
    case 'sessions': page = <Sessions me={me} />; break;
    case 's': page = <SessionPage key={route[1]} me={me} id={route[1]} tab={route[2] || 'terminal'} />; break;
    case 'usage': page = <Usage me={me} />; break;
    case 'tokens': page = <Tokens me={me} />; break;
    case 'members': page = can('org.manage') ? <Members me={me} /> : <Forbidden what="members and roles" perm="org.manage" />; break;
    case 'audit': page = can('audit.read') ? <Audit me={me} /> : <Forbidden what="the audit log" perm="audit.read" />; break;
    default: page = <div class="page"><h1>Not found</h1><p>No such page. <a href="#/sessions">Sessions</a></p></div>;
  }
  const active = route[0] === 's' ? 'sessions' : (route[0] || 'sessions');
  const key = route.join('/');
  return (
    <div class="shell">
      <a class="skip" href="#main" onClick={(e) => { e.preventDefault(); document.getElementById('main').focus(); }}>Skip to content</a>
      <nav class="side" aria-label="Main">
        <a class="brand" href="#/sessions"><img src="/assets/icon.svg" alt="" width="24" height="24" /> sandboxd</a>
        <ul>
          {NAV.filter((n) => can(n.perm)).map((n) => (
            <li><a href={'#/' + n.path} aria-current={active === n.path ? 'page' : undefined}><n.icon size={16} aria-hidden="true" /> {n.label}</a></li>
          ))}
        </ul>
        <div class="who" aria-label="Signed in as">
          <div class="who-name" id="who-name">{me.user.name}</div>
          <div class="who-org"><Building2 size={14} aria-hidden="true" /> <span id="who-org">{me.organization.name}</span> · <span id="who-role" class="role">{me.role}</span></div>
          <button class="ghost signout" onClick={signOut}><LogOut size={14} aria-hidden="true" /> Sign out</button>
        </div>
      </nav>
      <main id="main" tabindex="-1"><Boundary route={key}>{page}</Boundary></main>
    </div>
  );
}

function Forbidden({ what, perm }) {
  return <div class="page"><h1>Not allowed</h1><p class="notice" role="alert">Your role cannot see {what}: it needs the <code>{perm}</code> permission. Ask an owner or admin of your organization.</p></div>;
}

function App() {
  const [me, setMe] = useState(null);
  const [ready, setReady] = useState(false);
  const [notice, setNotice] = useState('');
  const [err, setErr] = useState(null);

  function signOut(msg) {
    token.clear();
    sessionStorage.clear(); // the terminals' ids too: the next person starts afresh
    setMe(null);
    setNotice(typeof msg === 'string' ? msg : 'You are signed out.');
  }

  useEffect(() => {
    setUnauthenticatedHandler((e) => signOut('You were signed out: ' + e.message + (e.requestId ? ' (request ' + e.requestId + ')' : '')));
    const onSignIn = (e) => { setNotice(''); setMe(e.detail); };
    const onRefresh = () => get('/v1/me').then(setMe).catch(() => {});
    addEventListener('sandboxd-signin', onSignIn);
    addEventListener('sandboxd-refresh-me', onRefresh);
    if (token.get()) {
      get('/v1/me').then(setMe).catch((e) => { if (e.status !== 401) setErr(e); }).finally(() => setReady(true));
    } else {
      setReady(true);
    }
    return () => { removeEventListener('sandboxd-signin', onSignIn); removeEventListener('sandboxd-refresh-me', onRefresh); };
  }, []);

  // Notice a revoked token, or a changed role, soon even on a quiet page.
  useEffect(() => {
    if (!me) return;
    const t = setInterval(() => {
      if (document.visibilityState !== 'visible') return;
      get('/v1/me').then((m) => {
        if (m.role !== me.role || m.permissions.join() !== me.permissions.join() || m.github.connected !== me.github.connected) setMe(m);
      }).catch(() => {});
    }, 15000);
    return () => clearInterval(t);
  }, [me]);

  if (!ready) return <p class="boot">Loading…</p>;
  if (err) return <main class="signin"><ErrorBox error={err} /><button onClick={() => location.reload()}>Retry</button></main>;
  if (!me) return <SignIn notice={notice} />;
  return <Shell me={me} signOut={() => signOut()} />;
}

render(<App />, document.getElementById('app'));
