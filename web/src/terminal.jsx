// A terminal tab: xterm.js over the terminal WebSocket, with resize,
// reconnect (re-attach by terminalId, which replays recent output) and
// exit.
import { useEffect, useRef, useState } from 'preact/hooks';
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import { WebLinksAddon } from '@xterm/addon-web-links';
import '@xterm/xterm/css/xterm.css';
import { enc, openWS } from './api.js';

const THEME = { background: '#0d1117', foreground: '#e6edf3', cursor: '#e6edf3', selectionBackground: '#264f78' };

export function Term({ sid, tid, active, onReady, onGone }) {
  const el = useRef();
  const [state, setState] = useState('connecting');
  const [note, setNote] = useState('');
  const termRef = useRef(null);

  useEffect(() => {
    const term = new Terminal({
      cursorBlink: true, fontSize: 14, scrollback: 5000, theme: THEME,
      fontFamily: 'ui-monospace, "DejaVu Sans Mono", "Liberation Mono", monospace',
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
      ws.onmessage = (m) => {
        if (typeof m.data !== 'string') { term.write(new Uint8Array(m.data)); return; }
        let ev;
        try { ev = JSON.parse(m.data); } catch (_) { return; }
        if (ev.type === 'ready') {
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
          onGone && ev.code === 'not_found' && onGone(cur);
        }
      };
      ws.onclose = (e) => {
        if (mine !== ws || stopped || done) return;
        if (e.code === 1008 || e.code === 4401 || e.code === 4403) { // refused: no use retrying
          setState('error');
          setNote(e.reason || 'The server closed the terminal.');
          return;
        }
        const wait = Math.min(500 * 2 ** retry, 8000);
        retry++;
        setState('reconnecting');
        setNote('Connection lost; reconnecting in ' + Math.round(wait / 1000) + ' s…');
        timer = setTimeout(() => { if (!stopped) { term.reset(); connect(); } }, wait);
      };
    };
    connect();
    const d1 = term.onData((d) => send(enc8.encode(d)));
    const d2 = term.onBinary((d) => send(Uint8Array.from(d, (c) => c.charCodeAt(0))));
    const d3 = term.onResize(({ cols, rows }) => send(JSON.stringify({ type: 'resize', cols, rows })));
    const ro = new ResizeObserver(refit);
    ro.observe(el.current);
    el.current.__term = term; // for tests and the page's focus handling
    return () => {
      stopped = true;
      clearTimeout(timer);
      ro.disconnect();
      d1.dispose(); d2.dispose(); d3.dispose();
      if (ws) ws.close();
      term.dispose();
    };
  }, [sid]);

  useEffect(() => {
    if (active && termRef.current) {
      requestAnimationFrame(() => {
        el.current && el.current.dispatchEvent(new Event('refit'));
        termRef.current && termRef.current.focus();
      });
    }
  }, [active]);

  return (
    <div class={'term-tab' + (active ? ' active' : '')} hidden={!active}>
      <div class={'term-state ts-' + state} role="status" aria-live="polite">
        <span class="dot" aria-hidden="true" />{state}{note && ' · ' + note}
      </div>
      <div class="term" ref={el} data-terminal={tid || ''} />
    </div>
  );
}
