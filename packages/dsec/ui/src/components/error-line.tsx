import { ApiCallError } from '../api';

/** An API or network error as one readable line (the code, then the API's message). */
export function ErrorLine(props: { error?: Error }) {
  const e = props.error;
  if (!e) return null;
  return <p class="error">{e instanceof ApiCallError ? `${e.code}: ${e.message}` : e.message}</p>;
}
