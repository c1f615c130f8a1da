// sandboxd's Node.js context: one global scope that persists between runs
// (top-level let/const/function stay defined). Same protocol as python.py,
// read from fd 3 (interp.Args moves it there; fd 0 is /dev/null, so child
// processes cannot read requests). The interpreter's own names live in this
// function, out of the cells' reach.
(function () {
  'use strict';
  const fs = require('fs');
  const net = require('net');
  const vm = require('vm');
  const util = require('util');
  const readline = require('readline');

  let mark = null;
  let displays = [];
  globalThis.display = (data, mime = 'text/plain') => {
    displays.push({ mime: String(mime), data: typeof data === 'string' ? data : util.inspect(data) });
  };
  globalThis.require = require;
  globalThis.module = module;
  let interrupt = null;
  process.on('SIGINT', () => { if (interrupt) interrupt(); });
  // An async error escaping a cell must not end the context.
  process.on('unhandledRejection', (e) => { process.stderr.write('Unhandled rejection: ' + util.inspect(e) + '\n'); });
  process.on('uncaughtException', (e) => { process.stderr.write('Uncaught exception: ' + ((e && e.stack) || util.inspect(e)) + '\n'); });

  function write(fd, s) {
    const b = Buffer.from(s);
    for (let off = 0; off < b.length;) {
      try {
        off += fs.writeSync(fd, b, off);
      } catch (e) {
        if (e.code !== 'EAGAIN') throw e;
      }
    }
  }

  async function run(code) {
    let script;
    try {
      script = new vm.Script(code, { filename: '<cell>' });
    } catch (e) {
      if (!(e instanceof SyntaxError) || !/await/.test(e.message)) throw e;
      // Top-level await: the cell runs in an async function (its
      // declarations stay local; `return x` gives the result).
      script = new vm.Script('(async () => {\n' + code + '\n})()', { filename: '<cell>', lineOffset: -1 });
    }
    let v = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
    if (v && typeof v.then === 'function') {
      v = await Promise.race([v, new Promise((_, reject) => {
        interrupt = () => { const e = new Error('interrupted'); e.name = 'KeyboardInterrupt'; reject(e); };
      })]);
    }
    return v;
  }

  // cellStack keeps a stack's message and the frames up to the last one in
  // the cell (the interpreter's own frames say nothing to the caller).
  function cellStack(stack) {
    const lines = String(stack || '').split('\n');
    let last = 0;
    lines.forEach((l, i) => { if (l.includes('<cell>')) last = i; });
    return lines.slice(0, last + 1).join('\n');
  }

  const queue = [];
  let busy = false;
  let closed = false;
  async function pump() {
    if (busy) return;
    busy = true;
    while (queue.length) {
      const req = JSON.parse(queue.shift());
      displays = [];
      const res = { seq: req.seq, result: null, error: null, display: [], truncated: false };
      try {
        const v = await run(req.code);
        if (v !== undefined) {
          res.result = util.inspect(v);
          if (res.result.length > req.maxResult) {
            res.result = res.result.slice(0, req.maxResult);
            res.truncated = true;
          }
        }
      } catch (e) {
        if (e instanceof Error || (e && e.stack)) {
          res.error = { name: String(e.name || 'Error'), value: e.message === undefined ? String(e) : String(e.message), traceback: cellStack(e.stack) };
        } else {
          res.error = { name: 'Error', value: 'Uncaught ' + util.inspect(e), traceback: '' };
        }
      }
      interrupt = null;
      let size = 0;
      for (const d of displays) {
        size += d.data.length + d.mime.length;
        if (size > req.maxDisplay) {
          res.truncated = true;
          break;
        }
        res.display.push(d);
      }
      write(1, mark + JSON.stringify(res) + '\n');
      write(2, mark + req.seq + '\n');
    }
    busy = false;
    if (closed) process.exit(0);
  }

  const rl = readline.createInterface({ input: new net.Socket({ fd: 3, readable: true, writable: false }), terminal: false });
  rl.on('line', (line) => {
    if (mark === null) {
      mark = '\x1e' + line.trim() + '\x1f';
      return;
    }
    queue.push(line);
    pump();
  });
  rl.on('close', () => { closed = true; if (!busy) process.exit(0); });
})();
