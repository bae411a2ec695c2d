import { FitAddon } from '@xterm/addon-fit';
import { Terminal } from '@xterm/xterm';
import '@xterm/xterm/css/xterm.css';
import { useEffect, useRef, useState } from 'preact/hooks';
import { apiRoot } from '../api';
import { readKey } from '../session-key';

/** Subprotocol the pty route answers with; the key travels as a second one (see below). */
const PTY_PROTOCOL = 'dsec.pty';
const BEARER_PROTOCOL_PREFIX = 'dsec.bearer.';

/**
 * A terminal in the sandbox: xterm.js on the API's pty WebSocket (binary frames both ways,
 * JSON text frames for resize, exit and errors). A browser cannot set an Authorization header
 * on a WebSocket, so the key goes in Sec-WebSocket-Protocol (as Kubernetes does with bearer
 * tokens), never in the URL, where proxies and logs would keep it.
 */
export function SandboxTerminal(props: { id: string; onClose: () => void }) {
  const box = useRef<HTMLDivElement>(null);
  const [status, setStatus] = useState('connecting…');

  useEffect(() => {
    const el = box.current;
    if (!el) return;
    const term = new Terminal({ cursorBlink: true, fontSize: 13, convertEol: false, scrollback: 2000 });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(el);
    fit.fit();

    const url = new URL(`v1/sandboxes/${encodeURIComponent(props.id)}/pty`, apiRoot);
    url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
    url.searchParams.set('cols', String(term.cols));
    url.searchParams.set('rows', String(term.rows));
    const ws = new WebSocket(url, [PTY_PROTOCOL, `${BEARER_PROTOCOL_PREFIX}${readKey() ?? ''}`]);
    ws.binaryType = 'arraybuffer';
    const encoder = new TextEncoder();

    ws.onopen = () => {
      setStatus('connected');
      term.focus();
    };
    ws.onmessage = (ev: MessageEvent<ArrayBuffer | string>) => {
      if (typeof ev.data !== 'string') return term.write(new Uint8Array(ev.data));
      const msg = JSON.parse(ev.data) as { type: string; exitCode?: number; error?: { code: string; message: string } };
      if (msg.type === 'exit') setStatus(`exited with code ${msg.exitCode}`);
      else if (msg.type === 'error') setStatus(`error ${msg.error?.code}: ${msg.error?.message}`);
    };
    ws.onclose = (ev) =>
      setStatus((s) => (s === 'connected' || s === 'connecting…' ? `closed (${ev.code}${ev.reason ? ` ${ev.reason}` : ''})` : s));
    const input = term.onData((data) => {
      if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(data));
    });
    const resize = term.onResize(({ cols, rows }) => {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', cols, rows }));
    });
    const onWindowResize = (): void => fit.fit();
    addEventListener('resize', onWindowResize);
    return () => {
      removeEventListener('resize', onWindowResize);
      input.dispose();
      resize.dispose();
      ws.close();
      term.dispose();
    };
  }, [props.id]);

  return (
    <div class="terminal-wrap">
      <div class="row">
        <span class="muted" data-testid="terminal-status">
          {status}
        </span>
        <button onClick={props.onClose}>Close terminal</button>
      </div>
      <div ref={box} class="terminal" data-testid="terminal" />
    </div>
  );
}
