// Small shared pieces: error banners, confirmation dialogs, gauges.
import { useEffect, useRef, useState } from 'preact/hooks';

// ErrorBox shows an API error in words with its request id.
export function ErrorBox({ error, onClose }) {
  if (!error) return null;
  return (
    <div class="error" role="alert">
      <div>
        <strong>{error.message}</strong>
        {error.code && <span class="code"> ({error.code}{error.status ? ', HTTP ' + error.status : ''})</span>}
        {error.requestId && <div class="rid">Request id: <code>{error.requestId}</code></div>}
      </div>
      {onClose && <button class="ghost" aria-label="Dismiss" onClick={onClose}>×</button>}
    </div>
  );
}

// Modal is a native <dialog>: focus moves in, Escape closes it.
export function Modal({ title, onClose, children, wide }) {
  const ref = useRef();
  useEffect(() => {
    const opener = document.activeElement; // focus goes back there after
    const d = ref.current;
    if (d && !d.open) d.showModal();
    const cancel = (e) => { e.preventDefault(); onClose(); };
    d.addEventListener('cancel', cancel);
    return () => {
      d.removeEventListener('cancel', cancel);
      if (opener && opener.isConnected && opener.focus) setTimeout(() => opener.focus(), 0);
    };
  }, []);
  return (
    <dialog ref={ref} class={wide ? 'wide' : ''} aria-label={title}>
      <header><h2>{title}</h2><button class="ghost" aria-label="Close" onClick={onClose}>×</button></header>
      {children}
    </dialog>
  );
}

// Confirm asks before a destructive action and shows its error.
export function Confirm({ title, body, action, danger, onDone, onClose }) {
  const [busy, setBusy] = useState(false);
  const [err, setErr] = useState(null);
  async function go() {
    setBusy(true);
    setErr(null);
    try {
      const r = await action();
      onDone && onDone(r);
      onClose();
    } catch (e) {
      setErr(e);
      setBusy(false);
    }
  }
  return (
    <Modal title={title} onClose={onClose}>
      <p>{body}</p>
      <ErrorBox error={err} />
      <div class="actions">
        {/* A destructive action never has the focus first: Enter twice must not delete. */}
        <button onClick={onClose} disabled={busy} autofocus={!!danger}>Cancel</button>
        <button class={danger ? 'danger' : 'primary'} onClick={go} disabled={busy} autofocus={!danger}>{busy ? 'Working…' : title}</button>
      </div>
    </Modal>
  );
}

export function Gauge({ label, value, max, text }) {
  const frac = max > 0 ? Math.min(1, value / max) : 0;
  const level = frac > 0.9 ? 'hot' : frac > 0.7 ? 'warm' : '';
  return (
    <div class="gauge">
      <div class="gauge-label"><span>{label}</span><span>{text}</span></div>
      <div class="bar" role="meter" aria-label={label} aria-valuemin="0" aria-valuemax={max || 0} aria-valuenow={value || 0}>
        <div class={'fill ' + level} style={{ width: (frac * 100).toFixed(1) + '%' }} />
      </div>
    </div>
  );
}

export function Status({ s }) {
  return <span class={'status st-' + s}>{s}</span>;
}

// usePoll calls f now and every ms while the page is visible.
export function usePoll(f, ms, deps) {
  useEffect(() => {
    let stop = false, timer;
    const tick = async () => {
      if (stop) return;
      if (document.visibilityState === 'visible') {
        try { await f(); } catch (_) { /* f shows its own errors */ }
      }
      if (!stop) timer = setTimeout(tick, ms);
    };
    tick();
    return () => { stop = true; clearTimeout(timer); };
  }, deps);
}
