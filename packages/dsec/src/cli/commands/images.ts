import { existsSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import type { Command } from 'commander';
import { Image } from '@dsec/sdk';
import { OptionsError, compileOptions } from '../../config/options.js';
import { buildBusyboxImage } from '../../image/builders/busybox.js';
import { buildFnRuntimeImage } from '../../image/builders/fn-runtime.js';
import { buildDebianImage } from '../../image/builders/debian.js';
import { buildE2bBaseImage } from '../../control/e2b/base-template.js';
import { ImageStore } from '../../image/image-store.js';
import { LayerStore } from '../../image/layer-store.js';
import { ImportError, importImage } from '../../image/oci-import.js';
import { DockerfileError } from '../../image/dockerfile/parser.js';
import { buildDockerfile, type DockerfileBuildOptions, type DockerfileBuildResult } from '../../image/dockerfile/builder.js';
import { sdkSandboxes } from '../../image/dockerfile/sandboxes.js';
import { BUILD_LABELS, controlPlaneSandboxes } from '../../control/build-sandboxes.js';
import { findRunningServer, startAllInOne } from '../../runtime/all-in-one.js';
import { checkImageName } from '../../image/builders/builder.js';
import { UsageError } from '../args.js';
import { collectList, humanBytes, printTable } from '../output.js';
import { imageServerUrl, localOnly } from './image-server.js';
import { registryClientFor } from '../../image/registry/registry-config.js';
import { parseRegistryRef, RegistryRefError } from '../../image/registry/registry-ref.js';
import { ImageTransferError } from '../../image/registry/registry-client.js';
import { pushImage } from '../../image/registry/image-push.js';
import { Progress } from '../progress.js';
import { pullImage } from '../../image/registry/image-pull.js';

function parseRegistryRefOrUsage(text: string): ReturnType<typeof parseRegistryRef> {
  try {
    return parseRegistryRef(text);
  } catch (err) {
    if (err instanceof RegistryRefError) throw new UsageError(err.message);
    throw err;
  }
}

/** A registry's refusal (wrong credentials, no such manifest, not a dsec image) is one line and exit code 1, not a stack trace. */
async function reportRegistryErrors(work: () => Promise<void>): Promise<void> {
  try {
    await work();
  } catch (err) {
    if (!(err instanceof ImageTransferError)) throw err;
    process.stderr.write(`dsec: ${err.message}\n`);
    process.exitCode = 1;
  }
}

/** Images live in the data dir's image store; the CLI works on it directly, with or without a server. */
function openStore(dataDir?: string): ImageStore {
  const opts = compileOptions({ dataDir });
  const layers = new LayerStore(opts.layerDir || opts.dataDir);
  return new ImageStore(opts.dataDir, layers);
}

/**
 * A Dockerfile build from the CLI: through the dsec server running on the data dir (its API, via
 * the SDK), or, when none runs, a server started in this process for the build (as `dsec demo`
 * does). Build sandboxes are killed step by step; other sandboxes are left alone.
 */
async function runDockerfileBuild(
  o: Omit<DockerfileBuildOptions, 'images' | 'sandboxes'> & { dataDir: string | undefined },
): Promise<DockerfileBuildResult> {
  const { dataDir: dataDirFlag, ...rest } = o;
  const options = compileOptions({ dataDir: dataDirFlag, logLevel: 'warn' });
  const images = openStore(options.dataDir);
  const conn = await findRunningServer(options.dataDir);
  if (conn) {
    o.progress?.(`using the dsec server at ${conn.url}`);
    // FROM a registry reference: the server pulls it, into the store the build reads.
    const pull = async (ref: string): Promise<string> => (await Image.pull(ref, { url: conn.url, apiKey: conn.apiKey })).image.id;
    return buildDockerfile({ ...rest, images, pull, sandboxes: sdkSandboxes({ url: conn.url, apiKey: conn.apiKey }, BUILD_LABELS) });
  }
  o.progress?.('no dsec server runs on this data dir: starting one in this process for the build');
  const dsec = await startAllInOne({ ...options, listen: '127.0.0.1:0' });
  try {
    return await buildDockerfile({
      ...rest,
      images: dsec.images,
      pull: localPull(dsec.images),
      sandboxes: controlPlaneSandboxes(dsec.control),
    });
  } finally {
    await dsec.close();
  }
}

/** A Dockerfile's FROM HOST/REPO:TAG pulled into `images` unnamed: a build does not move a local name (REPO:TAG) to it. */
function localPull(images: ImageStore): NonNullable<DockerfileBuildOptions['pull']> {
  return async (text, progress) => {
    const ref = parseRegistryRef(text);
    const client = registryClientFor(ref, { onRetry: (why) => progress(`retrying: ${why}`) });
    return (await pullImage(images, client, ref, { progress, tag: false })).id;
  };
}

export function registerImageCommands(program: Command): void {
  const image = program
    .command('image')
    .description(
      "build and list images: with DSEC_URL set (and no --data-dir), the server's, through its API; else this host's data dir's",
    );
  image
    .command('ls')
    .description('list images')
    .option('--data-dir <dir>', 'state directory (env DSEC_DATA_DIR)')
    .option('--json', 'machine-readable output')
    .action(async (f: { dataDir?: string; json?: boolean }) => {
      const list = imageServerUrl(f.dataDir) ? (await Image.list()).map((i) => i.info!) : openStore(f.dataDir).list();
      const rows = list.map((i) => ({
        ...i,
        id: i.id.slice(0, 19),
        names: i.names.join(', '),
        layers: i.layers.length,
        size: humanBytes(i.sizeBytes),
      }));
      printTable(f.json ? list : rows, ['names', 'id', 'layers', 'size', 'createdAt'], f.json ?? false);
    });
  image
    .command('build')
    .description(
      "build an image: busybox (a few MB, seconds), debian (debootstrap minbase, about a minute), e2b-base (E2B's base template: debian + user `user`, python3, sudo; named base), or from a Dockerfile: build -f Dockerfile CONTEXT (RUN steps run in real sandboxes; needs root)",
    )
    .argument(
      '[target]',
      'busybox | debian | e2b-base | fn-runtime (python3, bash, node from this host: the default image of fn calls) | a build context directory (with -f, or holding a Dockerfile)',
    )
    .option('--name <name>', 'tag the image with this name')
    .option('-p, --package <pkg>', 'debian: extra package to install (repeatable)', collectList)
    .option('-f, --file <dockerfile>', 'the Dockerfile (default CONTEXT/Dockerfile)')
    .option('--build-arg <k=v>', 'a Dockerfile build argument (repeatable)', collectList)
    .option('--no-cache', 'run every Dockerfile step again')
    .option('--data-dir <dir>', 'state directory (env DSEC_DATA_DIR)')
    .action(
      async (
        target: string | undefined,
        f: { name?: string; package?: string[]; file?: string; buildArg?: string[]; cache?: boolean; dataDir?: string },
      ) => {
        // Every argument is checked before any work: a debian build takes a minute.
        if (f.name !== undefined) checkImageName(f.name);
        const builders = ['busybox', 'debian', 'e2b-base', 'fn-runtime'];
        const isContext = target !== undefined && !builders.includes(target) && existsSync(target) && statSync(target).isDirectory();
        if (!f.file && !isContext && target !== undefined && !builders.includes(target)) {
          throw new UsageError(
            `unknown builder or context ${JSON.stringify(target)}: use busybox, debian, e2b-base, fn-runtime, or a directory holding a Dockerfile (or -f FILE)`,
          );
        }
        if (f.package?.length && target !== 'debian')
          throw new UsageError('-p/--package goes with the debian builder (a Dockerfile installs packages with RUN)');
        const server = imageServerUrl(f.dataDir);
        if (server) {
          if (target === 'busybox' || target === 'debian' || target === 'fn-runtime') {
            process.stderr.write(`building ${target} on the dsec server at ${server}\n`);
            const built = await Image.build({
              builder: target,
              ...(f.name ? { name: f.name } : {}),
              ...(f.package ? { packages: f.package } : {}),
            });
            const names = built.info!.names;
            const name = names.find((n) => f.name !== undefined && (n === f.name || n === `${f.name}:latest`)) ?? names[0] ?? '';
            process.stdout.write(`${name} ${built.id}\n`);
            return;
          }
          throw target === 'e2b-base'
            ? localOnly('the e2b-base builder', server, "run it on the server's host (dsec image build e2b-base there)")
            : localOnly(
                'a Dockerfile build',
                server,
                "run it on the server's host, or build here without DSEC_URL and move the image with dsec image push / pull through a registry the cluster uses",
              );
        }
        if (f.file || isContext || target === undefined) {
          const contextDir = target ?? '.';
          const dockerfile = f.file ?? join(contextDir, 'Dockerfile');
          if (!existsSync(dockerfile))
            throw new OptionsError(`no Dockerfile at ${dockerfile}: give one with -f, or a builder (busybox, debian)`);
          const buildArgs: Record<string, string> = {};
          for (const kv of f.buildArg ?? []) {
            const i = kv.indexOf('=');
            if (i <= 0) throw new OptionsError(`--build-arg ${kv}: expected KEY=VALUE`);
            buildArgs[kv.slice(0, i)] = kv.slice(i + 1);
          }
          const bar = new Progress(`building ${f.name ?? contextDir}`);
          const progress = (m: string): void => bar.log(`${m}\n`);
          try {
            const r = await runDockerfileBuild({
              dataDir: f.dataDir,
              dockerfile: readFileSync(dockerfile, 'utf8'),
              contextDir,
              name: f.name,
              buildArgs,
              noCache: f.cache === false,
              progress,
              // The Step lines are in the log already; a terminal also gets a bar.
              onStep: (n, total, instruction) => {
                if (!bar.tty) return;
                bar.update(n, total);
                bar.step(instruction);
              },
              output: (chunk) => bar.log(chunk.toString()),
            });
            bar.end();
            process.stdout.write(`${r.name ?? ''}${r.name ? ' ' : ''}${r.id}\n`);
          } catch (err) {
            bar.end();
            if (!(err instanceof DockerfileError)) throw err;
            process.stderr.write(`dsec: build failed: ${err.message}\n`);
            process.exitCode = 1;
          }
          return;
        }
        const store = openStore(f.dataDir);
        // No total to count (debootstrap, mkfs.erofs): a spinner with the step and the time; a
        // builder's indented lines (debootstrap's own output) scroll above it.
        const bar = new Progress(`building ${target}`);
        const progress = (m: string): void => (m.startsWith('  ') ? bar.log(`${m}\n`) : bar.step(m));
        let built;
        try {
          if (target === 'busybox') built = await buildBusyboxImage(store, { name: f.name, progress });
          else if (target === 'debian') built = await buildDebianImage(store, { name: f.name, packages: f.package, progress });
          else if (target === 'fn-runtime') built = await buildFnRuntimeImage(store, { ...(f.name ? { name: f.name } : {}), progress });
          else if (target === 'e2b-base') built = await buildE2bBaseImage(store, { ...(f.name ? { name: f.name } : {}), progress });
          else
            throw new UsageError(
              `unknown builder ${JSON.stringify(target)}: use busybox, debian, e2b-base, or a Dockerfile context directory`,
            );
        } finally {
          bar.end();
        }
        process.stdout.write(`${built.name} ${built.id}\n`);
      },
    );
  image
    .command('import')
    .description('import an OCI image layout (directory or tar) or a `docker save` archive into the local image store')
    .argument('<path>', 'a directory holding an OCI layout, or a tar (gzip/zstd allowed) of a layout or of `docker save`')
    .option('--name <name>', 'tag the image with this name (default: the name the archive gives it)')
    .option('--squash', 'merge all layers into one EROFS layer')
    .option('--ref <ref>', 'which image, when the archive holds several')
    .option('--data-dir <dir>', 'state directory (env DSEC_DATA_DIR)')
    .option('--json', 'machine-readable output')
    .action(async (path: string, f: { name?: string; squash?: boolean; ref?: string; dataDir?: string; json?: boolean }) => {
      if (f.name !== undefined) checkImageName(f.name);
      if (!existsSync(path)) throw new UsageError(`no such file or directory: ${path}`);
      const server = imageServerUrl(f.dataDir);
      if (server)
        throw localOnly(
          'image import',
          server,
          `send the archive to the server's API instead (POST ${server}/v1/images/import with the tar as the body, Content-Type: application/x-tar)`,
        );
      const store = openStore(f.dataDir);
      const bar = new Progress(`importing ${path}`);
      const progress = (m: string): void => bar.log(`${m}\n`);
      let r;
      try {
        r = await importImage(store, path, {
          name: f.name,
          squash: f.squash ?? false,
          ref: f.ref,
          progress,
          onLayer: (i, total) => bar.update(i, total),
        });
        bar.end();
      } catch (err) {
        bar.end();
        if (!(err instanceof ImportError)) throw err;
        process.stderr.write(`dsec: image import failed: ${err.message}\n`);
        process.exitCode = 1;
        return;
      }
      if (f.json) process.stdout.write(JSON.stringify({ ...r, image: store.info(r.id) }, null, 2) + '\n');
      else process.stdout.write(`${r.name} ${r.id}\n`);
    });
  image
    .command('push')
    .description(
      'push a local image to an OCI registry as a dsec artifact (its EROFS layers, dsec media types); credentials from DSEC_REGISTRY_USER and DSEC_REGISTRY_PASSWORD',
    )
    .argument('<ref>', 'where to: [https://]HOST[:PORT]/REPOSITORY[:TAG] (loopback hosts speak http unless https:// is written)')
    .option('--image <name>', 'the local image to push (default: the last part of REPOSITORY with TAG, e.g. busybox:latest)')
    .option('--data-dir <dir>', 'state directory (env DSEC_DATA_DIR)')
    .option('--json', 'machine-readable output')
    .action(async (refText: string, f: { image?: string; dataDir?: string; json?: boolean }) => {
      const ref = parseRegistryRefOrUsage(refText);
      if (ref.digest !== undefined)
        throw new UsageError(`push to a tag, not a digest (${refText}): the registry names the manifest's digest`);
      const local = f.image ?? `${ref.repository.split('/').pop()}:${ref.tag}`;
      const progress = (m: string): void => void process.stderr.write(`${m}\n`);
      const server = imageServerUrl(f.dataDir);
      if (server) {
        // The server pushes from its store with its own registry account.
        progress(`pushing ${local} from the dsec server at ${server}`);
        const r = await Image.push(local, refText);
        if (f.json) process.stdout.write(JSON.stringify(r, null, 2) + '\n');
        else process.stdout.write(`${ref.host}/${ref.repository}@${r.digest}\n`);
        return;
      }
      await reportRegistryErrors(async () => {
        const r = await pushImage(
          openStore(f.dataDir),
          local,
          registryClientFor(ref, { onRetry: (why) => progress(`retrying: ${why}`) }),
          ref.tag ?? 'latest',
          progress,
        );
        if (f.json) process.stdout.write(JSON.stringify({ ref: `${ref.host}/${ref.repository}:${ref.tag}`, ...r }, null, 2) + '\n');
        else process.stdout.write(`${ref.host}/${ref.repository}@${r.digest}\n`);
      });
    });
  image
    .command('pull')
    .description(
      'pull an image from an OCI registry (by tag or @sha256 digest): a dsec image, or a container image (linux on this architecture) imported as by dsec image import; broken downloads resume',
    )
    .argument('<ref>', '[https://]HOST[:PORT]/REPOSITORY[:TAG|@sha256:DIGEST]')
    .option('--name <name>', 'tag the image with this name (default: the last part of REPOSITORY with TAG)')
    .option('--data-dir <dir>', 'state directory (env DSEC_DATA_DIR)')
    .option('--json', 'machine-readable output')
    .action(async (refText: string, f: { name?: string; dataDir?: string; json?: boolean }) => {
      if (f.name !== undefined) checkImageName(f.name);
      const ref = parseRegistryRefOrUsage(refText);
      const progress = (m: string): void => void process.stderr.write(`${m}\n`);
      const server = imageServerUrl(f.dataDir);
      if (server) {
        progress(`pulling into the dsec server at ${server}`);
        const { handle: _handle, ...r } = await Image.pull(refText, f.name !== undefined ? { name: f.name } : {});
        if (f.json) process.stdout.write(JSON.stringify(r, null, 2) + '\n');
        else process.stdout.write(`${r.image.names[0] ? `${r.image.names[0]} ` : ''}${r.image.id}\n`);
        return;
      }
      await reportRegistryErrors(async () => {
        const r = await pullImage(openStore(f.dataDir), registryClientFor(ref, { onRetry: (why) => progress(`retrying: ${why}`) }), ref, {
          name: f.name,
          progress,
        });
        if (f.json) process.stdout.write(JSON.stringify(r, null, 2) + '\n');
        else process.stdout.write(`${r.name ? `${r.name} ` : ''}${r.id}\n`);
      });
    });
  image
    .command('rm')
    .description('untag an image name, or delete an image by id (needs a running dsec)')
    .argument('<refs...>', 'names or ids')
    .action(async (refs: string[]) => {
      for (const ref of refs) {
        await Image.delete(ref);
        process.stdout.write(`${ref}\n`);
      }
    });
  image
    .command('gc')
    .description('delete layer blobs no image or live sandbox uses (needs a running dsec)')
    .option('--json', 'machine-readable output')
    .action(async (f: { json?: boolean }) => {
      const r = await Image.gc();
      if (f.json) process.stdout.write(JSON.stringify(r, null, 2) + '\n');
      else {
        process.stdout.write(
          `removed ${r.removedLayers.length} layers (${humanBytes(r.freedBytes)}); kept ${r.keptLayers}: ${r.keptInUse} in use by an image or a live sandbox`,
        );
        if (r.keptYoung)
          process.stdout.write(
            `, ${r.keptYoung} unused but younger than ${r.graceSeconds / 60} minutes (${humanBytes(r.keptYoungBytes)}; a build or snapshot may still register them: run gc again later)`,
          );
        process.stdout.write('\n');
      }
    });
}
