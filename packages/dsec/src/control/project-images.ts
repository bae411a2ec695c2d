import type { ImageInfo } from '@dsec/sdk/schema';
import { ApiError } from '../api-error.js';
import { type ImageId, type ImageStore, isImageName, normalizeName } from '../image/image-store.js';
import type { StateStore } from './state-store.js';
import { thenOrNow, type MaybePromise } from '../maybe-promise.js';

/**
 * Which images a project may use (docs/PROJECTS.md). An image id or name with owner rows in the
 * store is private to those projects: snapshots (and forks) made by a project's keys are its
 * own. One without owner rows is shared: base images the operator builds or imports (builds,
 * imports and GC take an admin key) and everything from before projects. An image another
 * project owns answers as if it did not exist, so its name and id do not leak.
 * `project` undefined means an admin view: every image.
 */
/**
 * A project no key has (names match PROJECT_NAME_PATTERN): resolving for it finds shared images
 * only. Function calls use it: their worker sandboxes are shared by every project.
 */
export const SHARED_IMAGES_ONLY = '';

export class ProjectImages {
  constructor(
    private readonly store: Pick<StateStore, 'imageOwners'>,
    private readonly images: ImageStore,
  ) {}

  /**
   * Resolves a name or id the project may use; undefined when there is none it can see. At once
   * when the image is known here and its owners are kept in memory (store/read-cache.ts): every
   * create resolves its image.
   */
  resolve(project: string | undefined, ref: string): MaybePromise<ImageId | undefined> {
    const id = this.images.resolve(ref);
    return id ? this.#visible(project, ref, id) : this.#resolveAfterRefresh(project, ref);
  }

  async #resolveAfterRefresh(project: string | undefined, ref: string): Promise<ImageId | undefined> {
    // Made at another replica a moment ago, perhaps: the store has the answer.
    await this.images.refresh();
    const id = this.images.resolve(ref);
    return id && this.#visible(project, ref, id);
  }

  #visible(project: string | undefined, ref: string, id: ImageId): MaybePromise<ImageId | undefined> {
    if (project === undefined) return id;
    const seen = ({ nameOwner, idOwners }: { nameOwner: string | undefined; idOwners: string[] }): ImageId | undefined => {
      if (nameOwner !== undefined && nameOwner !== project) return undefined;
      return idOwners.length === 0 || idOwners.includes(project) ? id : undefined;
    };
    return thenOrNow(this.store.imageOwners.owners(isImageName(ref) ? normalizeName(ref) : undefined, id), seen);
  }

  /** The images a project sees, each with only the names it sees. */
  async list(project: string | undefined): Promise<ImageInfo[]> {
    await this.images.refresh();
    const all = this.images.list();
    if (project === undefined) return all;
    const out: ImageInfo[] = [];
    for (const info of all) {
      if (!(await this.#idVisible(project, info.id as ImageId))) continue;
      const names: string[] = [];
      for (const n of info.names) if (await this.#nameVisible(project, n)) names.push(n);
      out.push({ ...info, names });
    }
    return out;
  }

  /** A project's image info with only the names it sees. */
  async info(project: string | undefined, id: ImageId): Promise<ImageInfo | undefined> {
    const info = this.images.info(id);
    if (!info || project === undefined) return info;
    const names: string[] = [];
    for (const n of info.names) if (await this.#nameVisible(project, n)) names.push(n);
    return { ...info, names };
  }

  /**
   * Records what a snapshot made: the image becomes the project's unless it existed already as a
   * shared image (an unchanged sandbox's snapshot is its base image, which stays shared).
   */
  async claim(project: string, id: ImageId, existedBefore: boolean): Promise<void> {
    if (!existedBefore || (await this.store.imageOwners.projects(id)).length > 0) await this.store.imageOwners.add(id, project);
  }

  /**
   * Checks that `project` may point `name` at an image: a name no one has yet becomes the
   * project's; a name of another project, or a shared name (unless `admin`), is IMAGE_NAME_TAKEN.
   * Returns the owner to record after tagging (undefined: the name stays shared).
   */
  async checkName(project: string, name: string, admin: boolean): Promise<string | undefined> {
    const n = normalizeName(name);
    const owner = await this.store.imageOwners.nameOwner(n);
    if (owner === project) return project;
    if (owner === undefined && this.images.resolve(n) === undefined) return project;
    if (owner === undefined && admin) return undefined;
    throw new ApiError(
      'IMAGE_NAME_TAKEN',
      `image name ${JSON.stringify(name)} is ${owner === undefined ? 'a shared image (only an admin key may move it)' : 'taken'}; choose another name`,
      {
        image: name,
      },
    );
  }

  /**
   * Checks that a pull may point `name` at what it pulls (POST /v1/images/pull): a name no one has
   * yet, or one the caller's project owns; a shared name only with an admin key. A name another
   * project owns is IMAGE_NAME_TAKEN whoever asks (an admin key removes it first), so a pull never
   * repoints a name someone else relies on. Returns the owner to record after tagging: the
   * caller's project, or undefined (shared) for an admin key's new or shared name.
   */
  async checkPullName(caller: { project: string; admin: boolean }, name: string): Promise<string | undefined> {
    const n = normalizeName(name);
    const owner = await this.store.imageOwners.nameOwner(n);
    if (owner === caller.project) return owner;
    const taken = (why: string): ApiError =>
      new ApiError('IMAGE_NAME_TAKEN', `image name ${JSON.stringify(name)} is ${why}; pull it under another name (\`name\`)`, {
        image: name,
      });
    if (owner !== undefined) throw taken(caller.admin ? "another project's (remove it first to reuse the name)" : 'taken');
    if (caller.admin) return undefined;
    await this.images.refresh();
    if (this.images.resolve(n) !== undefined) throw taken('a shared image (only an admin key may move it)');
    return caller.project;
  }

  /**
   * Whether a project may stack a layer by its digest (`layers: ["sha256:…"]`): yes when an image
   * it may use holds the layer, or no image does (a layer of the store alone); no when only other
   * projects' private images hold it, which then answers as an unknown digest does.
   */
  async layerVisible(project: string | undefined, digest: string): Promise<boolean> {
    if (project === undefined) return true;
    await this.images.refresh();
    let held = false;
    for (const info of this.images.list()) {
      if (!info.layers.includes(digest)) continue;
      if (await this.#idVisible(project, info.id as ImageId)) return true;
      held = true;
    }
    return !held;
  }

  async recordName(name: string, owner: string | undefined): Promise<void> {
    if (owner !== undefined) await this.store.imageOwners.setNameOwner(normalizeName(name), owner);
  }

  /**
   * Deletes a name or an image for a project: its own private ones only. A shared image needs an
   * admin key (FORBIDDEN); another project's answers IMAGE_NOT_FOUND.
   */
  async remove(caller: { project: string; admin: boolean }, ref: string): Promise<void> {
    const notFound = new ApiError('IMAGE_NOT_FOUND', `no image ${JSON.stringify(ref)}`, { image: ref });
    const id = await this.resolve(caller.admin ? undefined : caller.project, ref);
    if (!id) throw notFound;
    if (ref.startsWith('sha256:')) {
      const owners = await this.store.imageOwners.projects(id);
      if (!caller.admin && owners.length === 0)
        throw new ApiError('FORBIDDEN', `image ${ref} is shared: deleting it takes an admin key`, { image: ref });
      if (!caller.admin && owners.length > 1) {
        // Other projects made the same image: only this project's claim on it goes.
        await this.store.imageOwners.remove(id, caller.project);
        for (const n of this.images.info(id)?.names ?? [])
          if ((await this.store.imageOwners.nameOwner(n)) === caller.project) this.#untag(n);
        return;
      }
      for (const n of this.images.info(id)?.names ?? []) await this.store.imageOwners.removeNameOwner(n);
      this.images.remove(id);
      await this.store.imageOwners.removeAll(id);
      return;
    }
    const n = normalizeName(ref);
    if (!caller.admin && (await this.store.imageOwners.nameOwner(n)) === undefined)
      throw new ApiError('FORBIDDEN', `image name ${ref} is shared: removing it takes an admin key`, { image: ref });
    this.#untag(n);
    await this.store.imageOwners.removeNameOwner(n);
  }

  /** An image went away (an unnamed snapshot released with its sandbox): its owner rows go too. */
  async forget(id: ImageId): Promise<void> {
    await this.store.imageOwners.removeAll(id);
  }

  #untag(name: string): void {
    this.images.untag(name);
  }

  async #idVisible(project: string, id: ImageId): Promise<boolean> {
    const owners = await this.store.imageOwners.projects(id);
    return owners.length === 0 || owners.includes(project);
  }

  async #nameVisible(project: string, name: string): Promise<boolean> {
    const owner = await this.store.imageOwners.nameOwner(name);
    return owner === undefined || owner === project;
  }
}
