#!/usr/bin/env python3
"""Instruction counts of the kernels in a cubin, for comparing two builds of a .cu file where no
disassembler is installed (this toolkit ships none): every sm_90 SASS instruction is 16 bytes, so a
kernel's .text section size / 16 is its instruction count. With --ops, also a histogram of the
opcodes, read from each instruction's low 9 bits; the names given are for the common ones only
(an unofficial map, checked against known kernels: one MUFU per ex2, one F2FP per two f32 -> bf16
conversions), the rest print as hex.

  nvcc -x cu -std=c++20 --expt-relaxed-constexpr -O3 -DNDEBUG -gencode arch=compute_90,code=sm_90 \\
       -I. -Ibazel-bin -cubin kernels/cuda/loss.cu -o /tmp/loss.cubin
  tools/sass_count.py /tmp/loss.cubin 'ce_fused' [--ops]
"""
import argparse
import collections
import re
import struct

# Keyed by the low 9 bits; bits 9-11 give the operand form (register, immediate, constant, uniform).
NAMES = {0x108: 'MUFU', 0x020: 'FMUL', 0x021: 'FADD', 0x023: 'FFMA', 0x00b: 'FSETP', 0x009: 'FMNMX', 0x03e: 'F2FP',
         0x016: 'PRMT', 0x024: 'IMAD', 0x00c: 'ISETP', 0x184: 'LDS', 0x188: 'STS', 0x181: 'LDG', 0x186: 'STG',
         0x189: 'SHFL', 0x147: 'BRA', 0x11d: 'BAR', 0x008: 'FSEL', 0x007: 'SEL', 0x002: 'MOV', 0x010: 'IADD3',
         0x011: 'LEA', 0x012: 'LOP3', 0x119: 'S2R', 0x14d: 'EXIT', 0x019: 'SHF', 0x118: 'NOP'}


def sections(path):
    data = open(path, 'rb').read()
    shoff, = struct.unpack_from('<Q', data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', data, 0x3a)
    headers = [struct.unpack_from('<IIQQQQIIQQ', data, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    for h in headers:
        name = data[names_at + h[0]:data.index(b'\0', names_at + h[0])].decode()
        yield name, data[h[4]:h[4] + h[5]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('cubin')
    ap.add_argument('pattern', nargs='?', default='', help='regex on the kernel section name')
    ap.add_argument('--ops', action='store_true', help='opcode histogram too')
    args = ap.parse_args()
    for name, text in sorted(sections(args.cubin)):
        if not name.startswith('.text.') or not re.search(args.pattern, name):
            continue
        short = re.sub(r'_ZN2mg7kernels\d+_GLOBAL__N__\w+?_cu_[0-9a-f]+_\d+', '', name[len('.text.'):])
        print(f'{len(text) // 16:6d}  {short[:100]}')
        if args.ops:
            ops = collections.Counter()
            for i in range(0, len(text), 16):
                op = struct.unpack_from('<Q', text, i)[0] & 0x1ff
                ops[NAMES.get(op, hex(op))] += 1
            print('        ' + ' '.join(f'{k}:{v}' for k, v in ops.most_common(16)))


if __name__ == '__main__':
    main()
