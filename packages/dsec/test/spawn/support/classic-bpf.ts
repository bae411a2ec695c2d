/**
 * A classic BPF interpreter for seccomp programs, to compare two programs by what they decide
 * rather than by their bytes: dsec-seccomp-bpf asks libseccomp for a binary tree of the syscalls
 * where crun compiles the same profile to a list, so the programs differ byte for byte while every
 * decision must be the same. Implements the whole instruction set a seccomp filter may use
 * (loads of `struct seccomp_data`, the scratch memory, ALU, jumps, returns).
 */

/** What a filter sees of one system call (`struct seccomp_data`). */
export interface SeccompData {
  nr: number;
  arch: number;
  instructionPointer?: bigint;
  /** Up to six arguments, 64-bit. */
  args?: readonly bigint[];
}

/** `struct seccomp_data` as the kernel lays it out (little-endian: x86). */
function seccompData(d: SeccompData): Buffer {
  const b = Buffer.alloc(64);
  b.writeInt32LE(d.nr, 0);
  b.writeUInt32LE(d.arch >>> 0, 4);
  b.writeBigUInt64LE(d.instructionPointer ?? 0n, 8);
  (d.args ?? []).forEach((a, i) => b.writeBigUInt64LE(BigInt.asUintN(64, a), 16 + 8 * i));
  return b;
}

/** Runs the program (8-byte instructions) on one call; returns its 32-bit verdict (SECCOMP_RET_*). */
export function runSeccompFilter(program: Buffer, call: SeccompData): number {
  if (program.length === 0 || program.length % 8 !== 0) throw new Error(`not a BPF program: ${program.length} bytes`);
  const data = seccompData(call);
  const mem = new Uint32Array(16);
  let a = 0;
  let x = 0;
  const count = program.length / 8;
  for (let pc = 0, steps = 0; pc < count; pc++, steps++) {
    if (steps > count) throw new Error('the program loops'); // classic BPF only jumps forward
    const code = program.readUInt16LE(pc * 8);
    const jt = program.readUInt8(pc * 8 + 2);
    const jf = program.readUInt8(pc * 8 + 3);
    const k = program.readUInt32LE(pc * 8 + 4);
    const cls = code & 0x07;
    const src = code & 0x08 ? x : k;
    switch (cls) {
      case 0x00: // LD
      case 0x01: {
        // LDX
        const mode = code & 0xe0;
        let v: number;
        if (mode === 0x00) v = k;
        else if (mode === 0x20 && cls === 0x00) {
          if ((code & 0x18) !== 0x00 || k % 4 !== 0 || k + 4 > data.length) throw new Error(`bad load at ${pc}`);
          v = data.readUInt32LE(k);
        } else if (mode === 0x60) v = mem[k]!;
        else if (mode === 0x80) v = data.length;
        else throw new Error(`unsupported load ${code.toString(16)} at ${pc}`);
        if (cls === 0x00) a = v >>> 0;
        else x = v >>> 0;
        break;
      }
      case 0x02: // ST
        mem[k] = a;
        break;
      case 0x03: // STX
        mem[k] = x;
        break;
      case 0x04: {
        // ALU
        const s = src >>> 0;
        switch (code & 0xf0) {
          case 0x00:
            a = (a + s) >>> 0;
            break;
          case 0x10:
            a = (a - s) >>> 0;
            break;
          case 0x20:
            a = Math.imul(a, s) >>> 0;
            break;
          case 0x30:
            a = s === 0 ? 0 : Math.floor(a / s) >>> 0;
            break;
          case 0x40:
            a = (a | s) >>> 0;
            break;
          case 0x50:
            a = (a & s) >>> 0;
            break;
          case 0x60:
            a = s >= 32 ? 0 : (a << s) >>> 0;
            break;
          case 0x70:
            a = s >= 32 ? 0 : a >>> s;
            break;
          case 0x80:
            a = -a >>> 0;
            break;
          case 0x90:
            a = s === 0 ? 0 : a % s;
            break;
          case 0xa0:
            a = (a ^ s) >>> 0;
            break;
          default:
            throw new Error(`unsupported ALU op ${code.toString(16)} at ${pc}`);
        }
        break;
      }
      case 0x05: {
        // JMP
        const op = code & 0xf0;
        if (op === 0x00) {
          pc += k;
          break;
        }
        const s = src >>> 0;
        const taken = op === 0x10 ? a === s : op === 0x20 ? a > s : op === 0x30 ? a >= s : op === 0x40 ? (a & s) !== 0 : undefined;
        if (taken === undefined) throw new Error(`unsupported jump ${code.toString(16)} at ${pc}`);
        pc += taken ? jt : jf;
        break;
      }
      case 0x06: // RET
        return ((code & 0x18) === 0x10 ? a : k) >>> 0;
      case 0x07: // MISC: TAX, TXA
        if ((code & 0xf8) === 0x00) x = a;
        else a = x;
        break;
    }
  }
  throw new Error('the program ran off its end');
}

const AUDIT_ARCH = { x86_64: 0xc000003e, i386: 0x40000003 } as const;
const X32_SYSCALL_BIT = 0x40000000;

/**
 * Every call worth asking two x86 filters about: each syscall number below 1024 on x86_64, i386
 * and x32 (x86_64's arch with the x32 bit), a few numbers out of range, an unknown architecture,
 * and for clone (56 on x86_64, 120 on i386) its first argument with no flag, each single flag bit
 * of both halves, and all bits.
 */
export function x86Calls(): SeccompData[] {
  const calls: SeccompData[] = [];
  const clones = [0n, (1n << 64n) - 1n, ...Array.from({ length: 64 }, (_, i) => 1n << BigInt(i))];
  for (let nr = 0; nr < 1024; nr++) {
    for (const arch of [AUDIT_ARCH.x86_64, AUDIT_ARCH.i386]) {
      const isClone = (arch === AUDIT_ARCH.x86_64 && nr === 56) || (arch === AUDIT_ARCH.i386 && nr === 120);
      for (const first of isClone ? clones : [0n, 0xffff_ffffn]) calls.push({ nr, arch, args: [first, 1n, 2n, 3n, 4n, 5n] });
    }
    calls.push({ nr: nr | X32_SYSCALL_BIT, arch: AUDIT_ARCH.x86_64, args: [0n] });
  }
  for (const nr of [-1, 0x7fffffff, 0x3fffffff, X32_SYSCALL_BIT - 1]) calls.push({ nr, arch: AUDIT_ARCH.x86_64 });
  calls.push({ nr: 0, arch: 0x12345678 });
  return calls;
}
