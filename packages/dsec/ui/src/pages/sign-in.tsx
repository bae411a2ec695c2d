import { useState } from 'preact/hooks';
import { ApiCallError, call } from '../api';
import { storeKey } from '../session-key';

/** Asks for an API key, checks it against the API, and keeps it for this tab only. */
export function SignInPage(props: { onSignedIn: () => void }) {
  const [key, setKey] = useState('');
  const [error, setError] = useState<string | undefined>();
  const [busy, setBusy] = useState(false);

  const submit = async (e: Event): Promise<void> => {
    e.preventDefault();
    setBusy(true);
    setError(undefined);
    try {
      await call('/v1/nodes', { key: key.trim() });
      storeKey(key.trim());
      props.onSignedIn();
    } catch (err) {
      setError(err instanceof ApiCallError && err.status === 401 ? 'That key is not known to this control plane.' : (err as Error).message);
    } finally {
      setBusy(false);
    }
  };

  return (
    <main class="sign-in">
      <form class="card" onSubmit={(e) => void submit(e)}>
        <h1>dsec</h1>
        <label>
          API key
          <input name="apiKey" type="password" autocomplete="off" required value={key} onInput={(e) => setKey(e.currentTarget.value)} />
        </label>
        <p class="muted">
          The key of <code>dsec up</code> is in <code>client.json</code> in its data dir. It stays in this tab (sessionStorage) and goes
          only to this control plane, as a bearer token.
        </p>
        {error && <p class="error">{error}</p>}
        <button type="submit" disabled={busy || !key.trim()}>
          Sign in
        </button>
      </form>
    </main>
  );
}
