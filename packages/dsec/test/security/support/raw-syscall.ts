/**
 * Raw system calls from inside a sandbox, without a compiler in the image: a tiny static x86-64
 * ELF assembled here, byte by byte, that makes a fixed sequence of system calls and reports how
 * far it got. busybox has no tool for bpf(2), kexec_load(2), keyctl(2), userfaultfd(2) or
 * AF_PACKET sockets; this lets a test make exactly the call an attacker would and read the errno
 * the kernel (or the seccomp filter) answered.
 *
 * Protocol of the binary: before step i it writes one byte, 'A'+i, to stdout; when a step returns
 * a negative value it exits with that errno (1..4095, so the exit status is errno & 0xff); when
 * every step succeeds it exits 0. So stdout says which step ran last and the exit status why it
 * stopped.
 */
import { constants as osConstants } from 'node:os';

/** An argument: a number, the result of the previous step, or bytes placed in the binary's data. */
export type Arg = number | bigint | 'prev' | Buffer;

export interface Step {
  /** x86-64 system call number. */
  nr: number;
  args?: Arg[];
}

/** x86-64 system call numbers of the calls the probes make. */
export const NR = {
  write: 1,
  socket: 41,
  sendto: 44,
  clone: 56,
  mount: 165,
  swapoff: 168,
  reboot: 169,
  init_module: 175,
  settimeofday: 164,
  kexec_load: 246,
  add_key: 248,
  keyctl: 250,
  unshare: 272,
  perf_event_open: 298,
  name_to_handle_at: 303,
  open_by_handle_at: 304,
  setns: 308,
  finit_module: 313,
  bpf: 321,
  userfaultfd: 323,
  kexec_file_load: 320,
  open_tree: 428,
  fsopen: 430,
  clone3: 435,
  ptrace: 101,
  process_vm_readv: 310,
  process_vm_writev: 311,
  kcmp: 312,
  io_uring_setup: 425,
  pidfd_open: 434,
  pidfd_getfd: 438,
} as const;

const BASE = 0x400000n;
const DATA_OFFSET = 0x1000;
const ARG_REGS = [
  [0x48, 0xbf], // mov rdi, imm64
  [0x48, 0xbe], // mov rsi, imm64
  [0x48, 0xba], // mov rdx, imm64
  [0x49, 0xba], // mov r10, imm64
  [0x49, 0xb8], // mov r8, imm64
  [0x49, 0xb9], // mov r9, imm64
] as const;
/** mov <arg reg>, r12 */
const FROM_R12 = [
  [0x4c, 0x89, 0xe7], // mov rdi, r12
  [0x4c, 0x89, 0xe6], // mov rsi, r12
  [0x4c, 0x89, 0xe2], // mov rdx, r12
  [0x4d, 0x89, 0xe2], // mov r10, r12
  [0x4d, 0x89, 0xe0], // mov r8, r12
  [0x4d, 0x89, 0xe1], // mov r9, r12
] as const;

function u64(v: bigint): number[] {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(BigInt.asUintN(64, v));
  return [...b];
}

/** Assembles the probe binary for `steps`. */
export function buildProbe(steps: Step[]): Buffer {
  const data: Buffer[] = [];
  let dataLen = 0;
  const place = (b: Buffer): bigint => {
    const addr = BASE + BigInt(DATA_OFFSET + dataLen);
    data.push(b);
    dataLen += b.length;
    // keep every blob 8-byte aligned (struct arguments)
    const pad = (8 - (b.length % 8)) % 8;
    if (pad) {
      data.push(Buffer.alloc(pad));
      dataLen += pad;
    }
    return addr;
  };
  const markers = place(Buffer.from('ABCDEFGHIJKLMNOPQRSTUVWXYZ'));

  const code: number[] = [];
  const failJumps: number[] = [];
  const movImm = (regIdx: number, v: bigint): void => {
    code.push(...ARG_REGS[regIdx]!, ...u64(v));
  };
  steps.forEach((step, i) => {
    // write(1, &markers[i], 1)
    code.push(0x48, 0xb8, ...u64(BigInt(NR.write)));
    movImm(0, 1n);
    movImm(1, markers + BigInt(i));
    movImm(2, 1n);
    code.push(0x0f, 0x05);
    code.push(0x48, 0xb8, ...u64(BigInt(step.nr))); // mov rax, nr
    (step.args ?? []).forEach((a, r) => {
      if (r >= 6) throw new Error('at most 6 arguments');
      if (a === 'prev') code.push(...FROM_R12[r]!);
      else if (Buffer.isBuffer(a)) movImm(r, place(a));
      else movImm(r, BigInt(a));
    });
    code.push(0x0f, 0x05); // syscall
    code.push(0x48, 0x85, 0xc0); // test rax, rax
    code.push(0x0f, 0x88, 0, 0, 0, 0); // js fail (rel32 patched below)
    failJumps.push(code.length);
    code.push(0x49, 0x89, 0xc4); // mov r12, rax
  });
  // exit(0)
  code.push(0xb8, 60, 0, 0, 0, 0x31, 0xff, 0x0f, 0x05); // mov eax,60; xor edi,edi; syscall
  const fail = code.length;
  code.push(0x48, 0xf7, 0xd8); // neg rax
  code.push(0x48, 0x89, 0xc7); // mov rdi, rax
  code.push(0xb8, 60, 0, 0, 0, 0x0f, 0x05); // mov eax,60; syscall
  const codeBuf = Buffer.from(code);
  for (const end of failJumps) codeBuf.writeInt32LE(fail - end, end - 4);

  const headers = 64 + 56;
  if (headers + codeBuf.length > DATA_OFFSET) throw new Error('probe code too long');
  const total = DATA_OFFSET + dataLen;
  const elf = Buffer.alloc(total);
  // ELF header
  Buffer.from([0x7f, 0x45, 0x4c, 0x46, 2, 1, 1, 0]).copy(elf, 0);
  elf.writeUInt16LE(2, 16); // ET_EXEC
  elf.writeUInt16LE(0x3e, 18); // EM_X86_64
  elf.writeUInt32LE(1, 20);
  elf.writeBigUInt64LE(BASE + BigInt(headers), 24); // e_entry
  elf.writeBigUInt64LE(64n, 32); // e_phoff
  elf.writeBigUInt64LE(0n, 40); // e_shoff
  elf.writeUInt32LE(0, 48);
  elf.writeUInt16LE(64, 52); // e_ehsize
  elf.writeUInt16LE(56, 54); // e_phentsize
  elf.writeUInt16LE(1, 56); // e_phnum
  // program header: one PT_LOAD, RWX, the whole file
  elf.writeUInt32LE(1, 64);
  elf.writeUInt32LE(7, 68);
  elf.writeBigUInt64LE(0n, 72);
  elf.writeBigUInt64LE(BASE, 80);
  elf.writeBigUInt64LE(BASE, 88);
  elf.writeBigUInt64LE(BigInt(total), 96);
  elf.writeBigUInt64LE(BigInt(total), 104);
  elf.writeBigUInt64LE(0x1000n, 112);
  codeBuf.copy(elf, headers);
  Buffer.concat(data).copy(elf, DATA_OFFSET);
  return elf;
}

/** What a probe run reported: how many steps started and the errno that stopped it (0: all succeeded). */
export interface ProbeOutcome {
  stepsStarted: number;
  errno: number;
  /** Name of the errno, e.g. EPERM (or 'OK'). */
  error: string;
}

const ERRNO_NAMES = new Map<number, string>(Object.entries(osConstants.errno).map(([k, v]) => [v, k]));

export function errnoName(errno: number): string {
  return errno === 0 ? 'OK' : (ERRNO_NAMES.get(errno) ?? `errno ${errno}`);
}

/** Decodes a probe's stdout and exit status. */
export function probeOutcome(stdout: string, exitCode: number): ProbeOutcome {
  return { stepsStarted: stdout.length, errno: exitCode, error: errnoName(exitCode) };
}

/** A NUL-terminated string argument. */
export function cstr(s: string): Buffer {
  return Buffer.from(`${s}\0`);
}

/** An IPv4 + UDP datagram (IP checksum computed, UDP checksum 0 = none). */
export function udpPacket(src: string, dst: string, srcPort: number, dstPort: number, payload: Buffer): Buffer {
  const ip = Buffer.alloc(20);
  const udpLen = 8 + payload.length;
  ip[0] = 0x45;
  ip.writeUInt16BE(20 + udpLen, 2);
  ip.writeUInt16BE(0x1234, 4);
  ip.writeUInt16BE(0x4000, 6); // DF
  ip[8] = 64;
  ip[9] = 17;
  Buffer.from(src.split('.').map(Number)).copy(ip, 12);
  Buffer.from(dst.split('.').map(Number)).copy(ip, 16);
  let sum = 0;
  for (let i = 0; i < 20; i += 2) sum += ip.readUInt16BE(i);
  while (sum > 0xffff) sum = (sum & 0xffff) + (sum >>> 16);
  ip.writeUInt16BE(~sum & 0xffff, 10);
  const udp = Buffer.alloc(8);
  udp.writeUInt16BE(srcPort, 0);
  udp.writeUInt16BE(dstPort, 2);
  udp.writeUInt16BE(udpLen, 4);
  return Buffer.concat([ip, udp, payload]);
}

/** struct sockaddr_ll for an AF_PACKET SOCK_DGRAM send of an IPv4 packet to `mac` on interface `ifindex`. */
export function sockaddrLl(ifindex: number, mac: string): Buffer {
  const b = Buffer.alloc(20);
  b.writeUInt16LE(17, 0); // AF_PACKET
  b.writeUInt16BE(0x0800, 2); // ETH_P_IP, network order
  b.writeInt32LE(ifindex, 4);
  b.writeUInt16LE(0, 8);
  b[10] = 0;
  b[11] = 6;
  Buffer.from(mac.split(':').map((x) => parseInt(x, 16))).copy(b, 12);
  return b;
}

/** Steps: open an AF_PACKET datagram socket, send one IPv4 packet through `ifindex` to the next hop `mac`. */
export function rawIpSendSteps(packet: Buffer, ifindex: number, mac: string): Step[] {
  return [
    { nr: NR.socket, args: [17, 2, 0x0008] }, // socket(AF_PACKET, SOCK_DGRAM, htons(ETH_P_IP))
    { nr: NR.sendto, args: ['prev', packet, packet.length, 0, sockaddrLl(ifindex, mac), 20] },
  ];
}

/** 16 bytes of an IPv6 address (full or `::`-compressed; no embedded IPv4). */
export function ipv6Bytes(addr: string): Buffer {
  const [head = '', tail] = addr.split('::');
  const h = head ? head.split(':') : [];
  const t = tail ? tail.split(':') : [];
  const groups = tail === undefined ? h : [...h, ...Array<string>(8 - h.length - t.length).fill('0'), ...t];
  const b = Buffer.alloc(16);
  groups.forEach((g, i) => b.writeUInt16BE(parseInt(g || '0', 16), i * 2));
  return b;
}

function ones16(buf: Buffer, sum = 0): number {
  for (let i = 0; i < buf.length; i += 2) sum += (buf[i]! << 8) + (buf[i + 1] ?? 0);
  return sum;
}

/**
 * An IPv6 router advertisement (to ff02::1, hop limit 255) with router lifetime 0 — so it never
 * installs a default route — and one prefix information option (on-link, no autoconf) for
 * `prefix`/64. A host that accepts it adds an on-link route for the prefix on the receiving
 * interface only (gone with the interface).
 */
export function routerAdvert(srcLinkLocal: string, prefix: string): Buffer {
  const icmp = Buffer.alloc(16 + 32);
  icmp[0] = 134; // router advertisement
  icmp[4] = 64; // cur hop limit
  // flags 0, router lifetime 0, reachable 0, retrans 0
  const o = 16;
  icmp[o] = 3; // prefix information
  icmp[o + 1] = 4; // length in 8-byte units
  icmp[o + 2] = 64; // prefix length
  icmp[o + 3] = 0x80; // L (on-link), not A (no autoconf)
  icmp.writeUInt32BE(300, o + 4); // valid lifetime
  icmp.writeUInt32BE(300, o + 8); // preferred lifetime
  ipv6Bytes(prefix).copy(icmp, o + 16);
  const src = ipv6Bytes(srcLinkLocal);
  const dst = ipv6Bytes('ff02::1');
  const pseudo = Buffer.alloc(40);
  src.copy(pseudo, 0);
  dst.copy(pseudo, 16);
  pseudo.writeUInt32BE(icmp.length, 32);
  pseudo[39] = 58;
  let sum = ones16(icmp, ones16(pseudo));
  while (sum > 0xffff) sum = (sum & 0xffff) + (sum >>> 16);
  icmp.writeUInt16BE(~sum & 0xffff, 2);
  const ip = Buffer.alloc(40);
  ip.writeUInt32BE(0x60000000, 0);
  ip.writeUInt16BE(icmp.length, 4);
  ip[6] = 58; // ICMPv6
  ip[7] = 255; // hop limit (required for neighbour discovery)
  src.copy(ip, 8);
  dst.copy(ip, 24);
  return Buffer.concat([ip, icmp]);
}

/** Steps: an AF_PACKET datagram socket for IPv6, one packet to the all-nodes multicast MAC on `ifindex`. */
export function rawIpv6MulticastSteps(packet: Buffer, ifindex: number): Step[] {
  const sll = sockaddrLl(ifindex, '33:33:00:00:00:01');
  sll.writeUInt16BE(0x86dd, 2); // ETH_P_IPV6
  return [
    { nr: NR.socket, args: [17, 2, 0xdd86] }, // socket(AF_PACKET, SOCK_DGRAM, htons(ETH_P_IPV6))
    { nr: NR.sendto, args: ['prev', packet, packet.length, 0, sll, 20] },
  ];
}
