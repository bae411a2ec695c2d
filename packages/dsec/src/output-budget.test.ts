import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { ApiError } from './api-error.js';
import { holdAnswer, jsonBodyBytes, OutputBudget, outputReservation, UNRESERVED_OUTPUT_BYTES, withBodyReserved } from './output-budget.js';

const NAMES = { whole: 'the whole', owner: "this project's half", otherwise: 'wait' };

const MiB = 2 ** 20;

function refusal(fn: () => unknown): ApiError {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof ApiError, String(err));
    return err;
  }
  assert.fail('expected OUTPUT_BUDGET_EXCEEDED');
}

describe('OutputBudget', () => {
  test('a command at the default cap (or below) reserves nothing; above it, both streams past the first MiB', () => {
    assert.equal(outputReservation(0), 0);
    assert.equal(outputReservation(UNRESERVED_OUTPUT_BYTES), 0);
    assert.equal(outputReservation(UNRESERVED_OUTPUT_BYTES + 1), 2);
    assert.equal(outputReservation(64 * MiB), 126 * MiB);
  });

  test('a project holds at most half the budget; another project still gets its half', () => {
    const budget = new OutputBudget(400 * MiB, NAMES, 0.5);
    const a1 = budget.reserve('a', 126 * MiB);
    budget.reserve('a', 40 * MiB);
    const err = refusal(() => budget.reserve('a', 126 * MiB));
    assert.equal(err.code, 'OUTPUT_BUDGET_EXCEEDED');
    assert.equal(err.status, 503);
    assert.match(err.message, /this project's half \(200 MiB\)/);
    assert.match(err.message, /stream the output/);
    assert.equal(err.details['ownerHeldBytes'], 166 * MiB);
    assert.equal(err.details['field'], 'maxOutputBytes');
    assert.equal(budget.heldBytes, 166 * MiB, 'a refusal holds nothing');
    budget.reserve('b', 126 * MiB);
    a1();
    budget.reserve('a', 126 * MiB); // a's first reservation came back
    assert.equal(budget.heldBytes, (40 + 126 + 126) * MiB); // a: 40 + 126, b: 126
  });

  test('the whole budget bounds every project together', () => {
    const budget = new OutputBudget(400 * MiB, NAMES, 0.5);
    for (const p of ['a', 'b', 'c']) budget.reserve(p, 126 * MiB);
    const err = refusal(() => budget.reserve('d', 126 * MiB));
    assert.match(err.message, /the whole \(400 MiB\)/);
    assert.equal(err.details['heldBytes'], 378 * MiB);
    budget.reserve('d', 22 * MiB); // what is left still fits
    assert.equal(budget.heldBytes, 400 * MiB);
  });

  test('a release gives back exactly once; a zero reservation is free even on a spent budget', () => {
    const budget = new OutputBudget(10 * MiB, NAMES, 0.5);
    const release = budget.reserve('a', 5 * MiB);
    release();
    release();
    assert.equal(budget.heldBytes, 0);
    budget.reserve('a', 5 * MiB);
    budget.reserve('b', 5 * MiB);
    assert.doesNotThrow(() => budget.reserve('a', 0)());
    const none = new OutputBudget(0, NAMES, 0.5);
    assert.doesNotThrow(() => none.reserve('a', outputReservation(UNRESERVED_OUTPUT_BYTES)));
    assert.equal(refusal(() => none.reserve('a', 2)).code, 'OUTPUT_BUDGET_EXCEEDED');
  });

  test('jsonBodyBytes bounds what a string takes in JSON: UTF-8 bytes, 6 for a control character', () => {
    for (const text of ['plain', 'é€𝄞', 'a"b\\c', '\n\t', '\u0001\u001f', '']) {
      assert.ok(jsonBodyBytes(text) >= Buffer.byteLength(JSON.stringify(text)) - 2, JSON.stringify(text));
    }
    assert.equal(jsonBodyBytes('\u0001'.repeat(10)), 60);
    assert.equal(jsonBodyBytes('abc'), 3);
  });

  test('holdAnswer reserves what an answer holds past the free 2 MiB, for as long as its hold keeps it', () => {
    const budget = new OutputBudget(100 * MiB, NAMES, 0.5);
    const held: (() => void)[] = [];
    holdAnswer(budget, 'a', 2 * MiB, 'small', (r) => held.push(r));
    assert.equal(held.length, 0, 'within the free part nothing is held');
    holdAnswer(budget, 'a', 42 * MiB, 'read 1', (r) => held.push(r));
    assert.equal(budget.heldBytes, 40 * MiB);
    assert.throws(() => holdAnswer(budget, 'a', 22 * MiB, 'read 2', (r) => held.push(r)), /read 2 is 22 MiB/);
    holdAnswer(budget, 'a', 50 * MiB, 'no hold', undefined);
    assert.equal(budget.heldBytes, 40 * MiB, 'without a hold nothing is reserved');
    held.forEach((r) => r());
    assert.equal(budget.heldBytes, 0);
  });

  test("withBodyReserved: a result's JSON past the free 2 MiB and its reservation is reserved too, even at the default cap; a refusal says how the command ended", () => {
    const budget = new OutputBudget(100 * MiB, NAMES, 0.5);
    const ran = (stdout: string) => ({ exitCode: 7, stdout, stderr: '', stdoutBytes: stdout.length, stderrBytes: 0 });
    const plain = withBodyReserved(budget, 'a', 0, ran('x'.repeat(MiB)), () => {});
    assert.equal(budget.heldBytes, 0, 'plain output within the free part holds nothing');
    plain();
    const control = withBodyReserved(budget, 'a', 0, ran('\u0001'.repeat(MiB)), () => {}); // 6 MiB of JSON at the default cap
    assert.equal(budget.heldBytes, 4 * MiB);
    let base = 0;
    const err = (() => {
      try {
        withBodyReserved(budget, 'a', 0, ran('\u0001'.repeat(10 * MiB)), () => base++);
      } catch (e) {
        return e as ApiError;
      }
      assert.fail('expected a refusal');
    })();
    assert.equal(base, 1, 'the reservation it came with is given back');
    assert.equal(err.code, 'RESULT_TOO_LARGE');
    assert.equal(err.status, 507);
    assert.match(err.message, /the command ran \(exit code 7\)/);
    assert.deepEqual([err.details['ran'], err.details['exitCode']], [true, 7]);
    control();
    assert.equal(budget.heldBytes, 0);
  });
});
