/** Where sandbox-side E2B requests are routed once `E2b-Sandbox-Id` has been seen (see e2bRewriteUrl). */
export const SANDBOX_PREFIX = '/e2b-sandbox';
