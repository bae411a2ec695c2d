/**
 * A value now, or a promise of it: what a read from memory answers (control/store/read-cache.ts),
 * so that its callers on a request's path (an API key's check, a project's quota, an image's
 * owners: every create makes all three) need not make a promise and wait a turn of microtasks for
 * a value they have. Under `dsec bench cluster` a create made ~60 promises, each one more object
 * and, with the request's log scope (AsyncLocalStorage), one more call of the async hooks.
 */
export type MaybePromise<T> = T | Promise<T>;

/** `f` of `value`: at once when it is a value, once it resolves when it is a promise. */
export function thenOrNow<T, U>(value: MaybePromise<T>, f: (v: T) => U): U | Promise<Awaited<U>> {
  return value instanceof Promise ? (value.then(f) as Promise<Awaited<U>>) : f(value);
}
