import { isImageName } from '../image-store.js';

// The names an archive gives its images, and the platform an image is for.

export function hostArchitecture(): string {
  const map: Record<string, string> = {
    x64: 'amd64',
    arm64: 'arm64',
    arm: 'arm',
    ia32: '386',
    ppc64: 'ppc64le',
    s390x: 's390x',
    riscv64: 'riscv64',
  };
  return map[process.arch] ?? process.arch;
}

/** `docker.io/library/busybox:1.36` → `busybox:1.36`; a name dsec accepts, or undefined. */
export function dsecNameFor(ref: string | undefined): string | undefined {
  if (!ref) return undefined;
  let r = ref.split('@')[0]!;
  const slash = r.lastIndexOf('/');
  if (slash >= 0) r = r.slice(slash + 1);
  r = r.toLowerCase().replace(/[^a-z0-9._:-]/g, '-');
  if (r.split(':').length > 2) return undefined;
  return isImageName(r) ? r : undefined;
}

export function refMatches(candidate: string | undefined, wanted: string): boolean {
  if (!candidate) return false;
  const norm = (s: string): string => (s.includes(':') ? s : `${s}:latest`);
  return (
    candidate === wanted || norm(candidate) === norm(wanted) || dsecNameFor(candidate) === norm(wanted) || dsecNameFor(candidate) === wanted
  );
}
