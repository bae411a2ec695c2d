import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { setUnauthorizedHandler } from './api';
import { href, useHashRoute, type Route } from './hash-route';
import { BatchPage, BatchesPage } from './pages/batches';
import { ImagesPage } from './pages/images';
import { OverviewPage } from './pages/overview';
import { SandboxPage } from './pages/sandbox';
import { SandboxesPage } from './pages/sandboxes';
import { SignInPage } from './pages/sign-in';
import { forgetKey, readKey } from './session-key';
import './styles.css';

function Page(props: { route: Route }) {
  const [section, id] = props.route.parts;
  switch (section) {
    case 'sandboxes':
      return id ? <SandboxPage id={id} /> : <SandboxesPage route={props.route} />;
    case 'batches':
      return id ? <BatchPage id={id} /> : <BatchesPage />;
    case 'images':
      return <ImagesPage />;
    default:
      return <OverviewPage />;
  }
}

const NAV: [string, string][] = [
  ['', 'Overview'],
  ['sandboxes', 'Sandboxes'],
  ['batches', 'Batches'],
  ['images', 'Images'],
];

function App() {
  const route = useHashRoute();
  const [signedIn, setSignedIn] = useState(() => readKey() !== undefined);
  useEffect(() => setUnauthorizedHandler(() => setSignedIn(false)), []);
  if (!signedIn) return <SignInPage onSignedIn={() => setSignedIn(true)} />;
  const section = route.parts[0] ?? '';
  return (
    <>
      <header>
        <b class="brand">dsec</b>
        <nav>
          {NAV.map(([path, label]) => (
            <a href={href(path ? [path] : [])} class={section === path ? 'active' : ''}>
              {label}
            </a>
          ))}
        </nav>
        <button
          class="sign-out"
          onClick={() => {
            forgetKey();
            setSignedIn(false);
          }}
        >
          Sign out
        </button>
      </header>
      <main>
        <Page route={route} />
      </main>
    </>
  );
}

render(<App />, document.getElementById('app')!);
