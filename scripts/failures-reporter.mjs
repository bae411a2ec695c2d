// A node:test reporter that writes one line per failed test (its file, its name, its error's
// message on one line) and nothing else. run-tests.mjs gives it a file beside the TAP stream and prints
// those lines at the very end of the suite, so that whoever reads only the tail of a long run
// (CI keeps the last part of the output) sees which tests failed and why.

/** The suites that failed only because a test inside them did: the tests themselves are listed. */
function onlyItsSubtestsFailed(data) {
  return data.details?.error?.failureType === 'subtestsFailed';
}

/** The error's message on one line, cut at 400 characters (an assertion's diff spans several lines). */
function oneLine(error) {
  // The test's own error is the cause; one that lost its message on the way (a DOMException from
  // AbortSignal.timeout arrives as a plain object) falls back to the runner's message for it.
  const cause = error?.cause;
  const message = typeof cause === 'string' ? cause : (cause?.message ?? error?.message ?? 'failed');
  const text = String(message).replace(/\s+/g, ' ').trim();
  return (text || 'failed').slice(0, 400);
}

export default async function* failuresReporter(source) {
  for await (const event of source) {
    if (event.type !== 'test:fail' || onlyItsSubtestsFailed(event.data)) continue;
    const file = event.data.file ? `${event.data.file.replace(/^.*\/dist\//, '')} › ` : '';
    yield `${file}${event.data.name}: ${oneLine(event.data.details?.error)}\n`;
  }
}
