import { ApiError } from '../../api-error.js';

/** Label of an unclaimed pool sandbox (value: the pool). Reserved: a caller's create may not set it. */
export const POOL_READY_LABEL = 'dsec.pool-ready';
/** Label of a batch's sandboxes (value: the batch's id). Reserved: a caller's create may not set it. */
export const BATCH_LABEL = 'dsec.batch';

/**
 * Labels dsec sets and then trusts, which a caller's spec may not carry: a sandbox of any project
 * labelled `dsec.pool-ready` was adopted into that pool at the next start (a batch's spec got past
 * the check, which only single creates made), and one labelled `dsec.batch` with another
 * project's batch id showed up, with its steps, in an admin's view of that batch by label (both
 * found by a red-team pass).
 */
const RESERVED_LABELS: Readonly<Record<string, string>> = {
  [POOL_READY_LABEL]: 'it marks an unclaimed pool sandbox',
  [BATCH_LABEL]: 'dsec sets it on the sandboxes of a batch',
};

/** Refuses a spec's labels that name a reserved label (INVALID_REQUEST, naming the field). */
export function refuseReservedLabels(labels: Record<string, string> | undefined): void {
  if (!labels) return;
  for (const [label, why] of Object.entries(RESERVED_LABELS))
    if (labels[label] !== undefined)
      throw new ApiError('INVALID_REQUEST', `label ${label} is reserved (${why}); use a label of your own`, { field: `labels.${label}` });
}
