/** One finding of `dsec doctor` (doctor.ts), and of the host-limit checks it runs (host-limits.ts). */
export interface Check {
  name: string;
  ok: boolean;
  detail: string;
  /** Set when doctor changed the host to make this check pass. */
  fixed?: string;
  /** Failing this check stops sandboxes from running at all. */
  required: boolean;
}
