import { InvalidArgumentError } from 'commander';

/**
 * A mistake in what the user typed (a bad mode, a missing value). main.ts prints its message
 * without a stack trace and exits 1; the message says what to type instead.
 */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

/** Option parser for a whole number ≥ min: `--memory 64`, `--timeout 5000`. */
export function intArg(min = 0): (value: string) => number {
  return (value) => {
    const n = Number(value);
    if (!/^\d+$/.test(value.trim()) || !Number.isSafeInteger(n) || n < min)
      throw new InvalidArgumentError(`expected a whole number ≥ ${min}, got ${JSON.stringify(value)}`);
    return n;
  };
}

/** Option parser for a positive number: `--cpu 0.5`. */
export function positiveArg(value: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n <= 0)
    throw new InvalidArgumentError(`expected a positive number, got ${JSON.stringify(value)}`);
  return n;
}

/** Option parser for one of a fixed set of words. */
export function choiceArg<T extends string>(choices: readonly T[]): (value: string) => T {
  return (value) => {
    if (!(choices as readonly string[]).includes(value))
      throw new InvalidArgumentError(`expected ${choices.join(' | ')}, got ${JSON.stringify(value)}`);
    return value as T;
  };
}
