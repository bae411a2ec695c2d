/**
 * Where the image commands act. Images live in a dsec server's image store: with DSEC_URL set
 * (and no --data-dir), that is the server it names, reached through its API, so an image a user
 * builds or pulls is the one the cluster runs; otherwise the store on this host's data dir,
 * read and written directly (with or without a server running on it).
 *
 * What the API cannot do for a remote store (a Dockerfile build, whose context and build cache
 * are on this host; the e2b-base builder; importing an archive) is refused with what to do
 * instead, never done silently into a local store that is not the server's.
 */
import { UsageError } from '../args.js';

/** The server's URL when the image commands go through its API, else undefined (the local store). */
export function imageServerUrl(dataDirFlag: string | undefined): string | undefined {
  const url = process.env['DSEC_URL'];
  return url && dataDirFlag === undefined ? url : undefined;
}

/** A refusal for work that only a local image store can do, saying how to do it instead. */
export function localOnly(what: string, url: string, instead: string): UsageError {
  return new UsageError(
    `${what} writes into an image store on this host, but DSEC_URL names the dsec server at ${url}: ${instead}; or give --data-dir to use this host's store`,
  );
}
