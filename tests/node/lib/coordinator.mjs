// Starts a real moe-coordinator (HTTP on a free port) for a node test and stops it afterwards.
//   const c = await startCoordinator({ model, args: ['--api-key', 'k'], ctx: 2048 });  c.baseUrl,
//   c.stop()
// The binaries come from $MOE_BIN_DIR (the build's bin/), the model from $MOE_TESTDATA.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export function testModel(name = 'tiny-qwen3moe-sv-Q8_0.gguf') {
  const dir = process.env.MOE_TESTDATA || process.env.MOE_TESTDATA_DEFAULT;
  if (!dir) throw new Error('MOE_TESTDATA is not set (the shared test data folder)');
  const path = join(dir, 'models', name);
  if (!existsSync(path)) throw new Error(`test model missing: ${path}`);
  return path;
}

export async function startCoordinator({
  model = testModel(), args = [], timeoutMs = 60000, ctx = 2048,
} = {}) {
  const bin = process.env.MOE_BIN_DIR;
  if (!bin) throw new Error('MOE_BIN_DIR is not set (the build\'s bin folder)');
  const work = mkdtempSync(join(tmpdir(), 'moe-node-'));
  const ready = join(work, 'ready');
  let log = '';
  const child = spawn(join(bin, 'moe-coordinator'),
                      ['-m', model, '--port', '0', '--http-port', '0', '-c', String(ctx),
                       '--ready-file', ready, ...args],
                      { stdio: ['ignore', 'ignore', 'pipe'] });
  child.stderr.on('data', (d) => { log += d; });
  let exited = null;
  child.on('exit', (code, signal) => { exited = { code, signal }; });
  const deadline = Date.now() + timeoutMs;
  let http = '';
  while (!http) {
    if (exited) throw new Error(`moe-coordinator exited (${JSON.stringify(exited)}):\n${log}`);
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`moe-coordinator did not start in ${timeoutMs} ms:\n${log}`);
    }
    if (existsSync(ready)) {
      const m = /^http (.+)$/m.exec(readFileSync(ready, 'utf8'));
      if (m) http = m[1];
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    baseUrl: `http://${http}`,
    log: () => log,
    // Stops it with SIGTERM and checks it exits cleanly (status 0).
    async stop() {
      if (!exited) {
        const done = new Promise((r) => child.on('exit', r));
        child.kill('SIGTERM');
        await done;
      }
      rmSync(work, { recursive: true, force: true });
      if (exited.code !== 0) {
        throw new Error(`moe-coordinator ended with ${JSON.stringify(exited)}:\n${log}`);
      }
    },
  };
}
