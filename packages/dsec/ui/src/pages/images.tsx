import type { ImageInfo } from '@dsec/sdk/schema';
import { getJson } from '../api';
import { ErrorLine } from '../components/error-line';
import { ago, bytes } from '../format';
import { usePoll } from '../use-poll';

export function ImagesPage() {
  const images = usePoll((signal) => getJson<{ images: ImageInfo[] }>('/v1/images', signal), 5000);
  const rows = [...(images.data?.images ?? [])].sort((a, b) => b.createdAt.localeCompare(a.createdAt));
  return (
    <div>
      <h1>Images</h1>
      <ErrorLine error={images.error} />
      <table data-testid="images">
        <thead>
          <tr>
            <th>names</th>
            <th>id</th>
            <th>layers</th>
            <th>size</th>
            <th>user / cwd</th>
            <th>created</th>
          </tr>
        </thead>
        <tbody>
          {rows.map((i) => (
            <tr>
              <td>
                {i.names.length ? (
                  i.names.join(', ')
                ) : (
                  <span class="muted">{i.snapshotOf ? `snapshot of ${i.snapshotOf}` : 'unnamed'}</span>
                )}
              </td>
              <td>
                <code title={i.id}>{i.id.slice(0, 19)}</code>
              </td>
              <td>{i.layers.length}</td>
              <td>{bytes(i.sizeBytes)}</td>
              <td>
                {i.config.user} <span class="muted">{i.config.cwd}</span>
              </td>
              <td title={i.createdAt}>{ago(i.createdAt)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
