// A terminal tab: xterm.js over the terminal WebSocket, with resize,
// reconnect (re-attach by terminalId, which replays recent output) and
// exit.
import { useEffect, useRef, useState } from 'preact/hooks';
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import { WebLinksAddon } from '@xterm/addon-web-links';
import '@xterm/xterm/css/xterm.css';
import { enc, get, openWS } from './api.js';

const THEME = { background: '#0d1117', foreground: '#e6edf3', cursor: '#e6edf3', selectionBackground: '#264f78' };

export function Term({ sid, tid, active, onReady, onGone, onLimit }) {
  const el = useRef();
  const [state, setState] = useState('connecting');
  const [note, setNote] = useState('');
  const termRef = useRef(null);
  const restart = useRef(null);

  useEffect(() => {
    const term = new Terminal({
      cursorBlink: true, fontSize: 14, lineHeight: 1.15, scrollback: 5000, theme: THEME,
      fontFamily: 'ui-monospace, "DejaVu Sans Mono", "Liberation Mono", monospace',
      // OSC 8 hyperlinks: http(s) only, in a new tab without an opener
      // (window.open without noopener would copy this tab's token).
      // The text of such a link is the sandbox's to choose: show where it
      // really goes first.
      linkHandler: { activate: (_, uri) => { if (/^https?:/i.test(uri) && confirm('Open this link from the sandbox?\n\n' + uri)) window.open(uri, '_blank', 'noopener,noreferrer'); } },
    });
    termRef.current = term;
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.loadAddon(new WebLinksAddon((_, uri) => window.open(uri, '_blank', 'noopener,noreferrer')));
    term.open(el.current);
    const refit = () => { if (el.current && el.current.offsetParent !== null) { try { fit.fit(); } catch (_) { } } };
    refit();
    const enc8 = new TextEncoder();
    let ws = null, cur = tid || '', retry = 0, timer = 0, stopped = false, done = false;
    const send = (x) => { if (ws && ws.readyState === WebSocket.OPEN) ws.send(x); };

    const connect = () => {
      const q = new URLSearchParams({ cols: String(term.cols), rows: String(term.rows) });
      if (cur) q.set('terminalId', cur);
      setState(retry ? 'reconnecting' : 'connecting');
      ws = openWS('/v1/sandbox/terminal/' + enc(sid) + '/ws?' + q);
      const mine = ws;
      let ready = false;
      ws.onmessage = (m) => {
        if (typeof m.data !== 'string') { term.write(new Uint8Array(m.data)); return; }
        let ev;
        try { ev = JSON.parse(m.data); } catch (_) { return; }
        if (ev.type === 'ready') {
          ready = true;
          cur = ev.terminalId;
          retry = 0;
          setState('connected');
          setNote('');
          onReady && onReady(cur);
          // The size may have changed while we were away.
          send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }));
        } else if (ev.type === 'exit') {
          done = true;
          setState('exited');
          setNote('The shell exited (status ' + ev.exitCode + ').');
          term.write('\r\n\x1b[2m[exited with status ' + ev.exitCode + ']\x1b[0m\r\n');
        } else if (ev.type === 'error') {
          done = true;
          setState('error');
          setNote(ev.message || ev.code);

        }
      };
      ws.onclose = async (e) => {
        if (mine !== ws || stopped || done) return;
        if (!ready && cur) {
          // Refused before the upgrade: is the shell still there? A
          // sandbox that restarted (teardown and resume, pause that
          // failed, a server restart) has none of its old terminals.
          try {
            const r = await get('/v1/sandbox/' + enc(sid) + '/terminals');
            if (stopped) return;
            if (!r.terminals.some((x) => x.terminalId === cur)) {
              cur = '';
              retry = 0;
              term.reset();
              term.write('\x1b[2m[the previous shell is gone: the sandbox restarted since it was opened; this is a new one]\x1b[0m\r\n');
              onGone && onGone();
              connect();
              return;
            }
          } catch (_) { /* offline or not running: retry below */ }
        }
        if (!ready && !cur) {
          // A new shell refused: at the session's terminal limit? Say so
          // and stop (each retry would be refused, and audited, again).
          try {
            const r = await get('/v1/sandbox/' + enc(sid) + '/terminals');
            if (stopped) return;
            if (r.terminals.length >= (r.limit || Infinity)) {
              done = true;
              setState('error');
              setNote('This session already has ' + r.terminals.length + ' shells, its limit. Close a tab, or end a detached shell below (one ends by itself 10 minutes after its last viewer).');
              onLimit && onLimit();
              return;
            }
          } catch (_) { }
        }
        if (e.code === 1008 || e.code === 4401 || e.code === 4403) { // refused: no use retrying
          setState('error');
          setNote(e.reason || 'The server closed the terminal.');
          return;
        }
        const wait = Math.min(500 * 2 ** retry, 8000);
        retry++;
        setState('reconnecting');
        setNote((ready || cur ? 'Connection lost' : 'Could not open a terminal (is the sandbox running? at most a few terminals per session)') + '; retrying in ' + Math.round(wait / 1000) + ' s…');
        timer = setTimeout(() => { if (!stopped) { term.reset(); connect(); } }, wait);
      };
    };
    connect();
    // A new shell in place of one that exited or was refused.
    restart.current = () => {
      if (ws) ws.close();
      cur = '';
      retry = 0;
      done = false;
      term.reset();
      onGone && onGone();
      connect();
    };
    // F6 leaves the terminal (it keeps Tab and Escape for the shell).
    term.attachCustomKeyEventHandler((e) => {
      if (e.key === 'F6' && e.type === 'keydown') {
        const b = el.current && el.current.closest('.terminals') && el.current.closest('.terminals').querySelector('.term-tabbtn.on button');
        if (b) b.focus();
        return false;
      }
      return true;
    });
    const d1 = term.onData((d) => send(enc8.encode(d)));
    const d2 = term.onBinary((d) => send(Uint8Array.from(d, (c) => c.charCodeAt(0))));
    const d3 = term.onResize(({ cols, rows }) => send(JSON.stringify({ type: 'resize', cols, rows })));
    const ro = new ResizeObserver(refit);
    ro.observe(el.current);
    // For tests: the xterm.js instance, and a way to cut the socket as a
    // network drop would.
    el.current.__term = term;
    el.current.__drop = () => ws && ws.close(4000, 'dropped');
    return () => {
      stopped = true;
      clearTimeout(timer);
      ro.disconnect();
      d1.dispose(); d2.dispose(); d3.dispose();
      if (ws) ws.close();
      term.dispose();
    };
  }, [sid]);

  // Focus follows a switch to this terminal, not the page's first render
  // (a keyboard user lands on the page, not in the shell).
  const first = useRef(true);
  useEffect(() => {
    if (first.current) { first.current = false; return; }
    if (active && termRef.current) requestAnimationFrame(() => termRef.current && termRef.current.focus());
  }, [active]);

  return (
    <div class={'term-tab' + (active ? ' active' : '')} hidden={!active}>
      <div class={'term-state ts-' + state} role="status" aria-live="polite">
        <span class="dot" aria-hidden="true" />{state}{note && ' · ' + note}
        {(state === 'exited' || state === 'error') && <button class="small new-shell" onClick={() => restart.current && restart.current()}>Start a new shell</button>}
      </div>
      <div class="term" ref={el} data-terminal={tid || ''} />
    </div>
  );
}
