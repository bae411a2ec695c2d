/**
 * The API key the dashboard signed in with. It lives in sessionStorage: scoped to this tab and
 * origin, gone when the tab closes, and never sent by the browser on its own (no cookie), so no
 * other site can make the browser act with it (no CSRF) and the API stays bearer-only.
 */
const STORAGE_KEY = 'dsec.apiKey';

export function readKey(): string | undefined {
  return sessionStorage.getItem(STORAGE_KEY) ?? undefined;
}

export function storeKey(key: string): void {
  sessionStorage.setItem(STORAGE_KEY, key);
}

export function forgetKey(): void {
  sessionStorage.removeItem(STORAGE_KEY);
}
