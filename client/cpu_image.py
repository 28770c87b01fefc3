# cpu_image.py: turn clang's ELF object for one tinygrad kernel into the image a CPU runner loads (PROTO_PROG_CPU_IMAGE)
# The image is relocated on the host at base 0 with no libraries: kernel code is position independent and only has PC-relative
# relocations, so the runner maps the bytes anywhere and calls image+entry. Anything that would need the host's address space is an error.
# x86-64 and arm64 objects go through tinygrad's jit_loader; it has no RISC-V relocations, so riscv64 ones are applied here (rv_relocate).
import ctypes, re, struct
from tinygrad.runtime.autogen import libc
from tinygrad.runtime.support.elf import elf_loader, jit_loader
from client.protocol import ARCHS

ARCH_CODES = {name: code for code, name in ARCHS.items()}
ELF_MACHINES = {libc.EM_X86_64: "x86_64", libc.EM_AARCH64: "arm64", libc.EM_RISCV: "riscv64"}
BASELINE_CPU = {"x86_64": "x86-64", "arm64": "generic", "riscv64": "rv64g"}

class ImageError(RuntimeError): pass

class RV:  # RISC-V ELF psABI relocation numbers (riscv-elf-psabi-doc, "Relocations")
  R_32, R_64, BRANCH, JAL, CALL, CALL_PLT, GOT_HI20, PCREL_HI20, PCREL_LO12_I, PCREL_LO12_S = 1, 2, 16, 17, 18, 19, 20, 23, 24, 25
  ADD32, ADD64, SUB32, SUB64, ALIGN, RVC_BRANCH, RVC_JUMP, RELAX = 35, 36, 39, 40, 43, 44, 45, 51

def _bits(v:int, hi:int, lo:int) -> int: return (v >> lo) & ((1 << (hi - lo + 1)) - 1)
def _itype(ins:int, v:int) -> int: return (ins & 0x000fffff) | (_bits(v, 11, 0) << 20)
def _stype(ins:int, v:int) -> int: return (ins & 0x01fff07f) | (_bits(v, 11, 5) << 25) | (_bits(v, 4, 0) << 7)
def _btype(ins:int, v:int) -> int:
  return (ins & 0x01fff07f) | (_bits(v, 12, 12) << 31) | (_bits(v, 10, 5) << 25) | (_bits(v, 4, 1) << 8) | (_bits(v, 11, 11) << 7)
def _jtype(ins:int, v:int) -> int:
  return (ins & 0xfff) | (_bits(v, 20, 20) << 31) | (_bits(v, 10, 1) << 21) | (_bits(v, 11, 11) << 20) | (_bits(v, 19, 12) << 12)
def _cbtype(ins:int, v:int) -> int:  # c.beqz/c.bnez: offset[8|4:3] in 12:10, offset[7:6|2:1|5] in 6:2
  return (ins & 0xe383) | (_bits(v, 8, 8) << 12) | (_bits(v, 4, 3) << 10) | (_bits(v, 7, 6) << 5) | (_bits(v, 2, 1) << 3) | (_bits(v, 5, 5) << 2)
def _cjtype(ins:int, v:int) -> int:  # c.j/c.jal: offset[11|4|9:8|10|6|7|3:1|5] in 12:2
  return (ins & 0xe003) | (_bits(v, 11, 11) << 12) | (_bits(v, 4, 4) << 11) | (_bits(v, 9, 8) << 9) | (_bits(v, 10, 10) << 8) | \
         (_bits(v, 6, 6) << 7) | (_bits(v, 7, 7) << 6) | (_bits(v, 3, 1) << 3) | (_bits(v, 5, 5) << 2)
def _hi20(off:int) -> int: return (off + 0x800) & ~0xfff   # auipc's part; the low 12 bits are sign-extended by the paired instruction

def rv_load(obj:bytes, name:str) -> tuple[list, bytearray, list[tuple[int, int, int, int]]]:
  """elf_loader's layout of a RISC-V object, with its relocations read here: elf_loader cannot read R_RISCV_RELAX and R_RISCV_ALIGN,
  which name no symbol, so it lays out a copy whose relocation sections are hidden. Returns (sections, image, [(place, S, type, A)])."""
  hdr = libc.Elf64_Ehdr.from_buffer_copy(obj)
  shdrs, hidden = (libc.Elf64_Shdr * hdr.e_shnum).from_buffer_copy(obj[hdr.e_shoff:]), bytearray(obj)
  for i, sh in enumerate(shdrs):
    if sh.sh_type == libc.SHT_RELA: struct.pack_into("<I", hidden, hdr.e_shoff + i * hdr.e_shentsize + 4, libc.SHT_NULL)
  image, sections, _ = elf_loader(bytes(hidden))
  symtab = next(s for s in sections if s.header.sh_type == libc.SHT_SYMTAB)
  syms = (libc.Elf64_Sym * (len(symtab.content) // ctypes.sizeof(libc.Elf64_Sym))).from_buffer_copy(symtab.content)
  strtab = sections[symtab.header.sh_link].content
  relocs = []
  for sh, sec in zip(shdrs, sections):
    if sh.sh_type != libc.SHT_RELA or not shdrs[sh.sh_info].sh_flags & libc.SHF_ALLOC or sec.name == ".rela.eh_frame": continue
    for r in (libc.Elf64_Rela * (sh.sh_size // ctypes.sizeof(libc.Elf64_Rela))).from_buffer_copy(sec.content):
      sym = syms[r.r_info >> 32]
      if r.r_info >> 32 and sym.st_shndx == libc.SHN_UNDEF:
        raise ImageError(f"kernel {name}: undefined symbol {strtab[sym.st_name:].split(bytes(1))[0].decode()} "
                         "(runner images are self-contained: no libm or libc calls)")
      s = sections[sym.st_shndx].header.sh_addr + sym.st_value if r.r_info >> 32 and sym.st_shndx < len(sections) else 0
      relocs.append((sections[sh.sh_info].header.sh_addr + r.r_offset, s, r.r_info & 0xffffffff, r.r_addend))
  return sections, bytearray(image), relocs

def rv_relocate(image:bytearray, relocs:list[tuple[int, int, int, int]], name:str) -> bytes:
  """Applies the relocations clang emits for a RISC-V kernel to image laid out at base 0 (elf_loader's (place, symbol, type, addend)).
  Everything is PC-relative, so the image runs wherever the runner maps it. R_RISCV_RELAX only permits the linker to shorten code, so it is
  ignored; R_RISCV_ALIGN padding is kept as the NOPs the assembler wrote (code stays correct, only the alignment it asked for may be lost)."""
  def fits(v:int, bits:int, what:str):
    if not -(1 << (bits - 1)) <= v < (1 << (bits - 1)): raise ImageError(f"kernel {name}: {what} offset {v} does not fit {bits} bits")
  u32 = lambda p: struct.unpack_from("<I", image, p)[0]
  def put32(p:int, v:int): struct.pack_into("<I", image, p, v & 0xffffffff)
  hi = {p: s + a - p for p, s, t, a in relocs if t == RV.PCREL_HI20}   # auipc address -> its full PC-relative offset
  for p, sym, t, a in relocs:
    off = sym + a - p
    match t:
      case RV.RELAX | RV.ALIGN: pass
      case RV.BRANCH: fits(off, 13, "branch"); put32(p, _btype(u32(p), off))
      case RV.JAL: fits(off, 21, "jal"); put32(p, _jtype(u32(p), off))
      case RV.CALL | RV.CALL_PLT:  # auipc ra/t1 + jalr: a PC-relative call within +-2 GiB
        fits(off, 32, "call")
        put32(p, (u32(p) & 0xfff) | _hi20(off)); put32(p + 4, _itype(u32(p + 4), off - _hi20(off)))
      case RV.PCREL_HI20: fits(off, 32, "pcrel"); put32(p, (u32(p) & 0xfff) | _hi20(off))
      case RV.PCREL_LO12_I | RV.PCREL_LO12_S:  # the symbol is the label of the auipc; the offset is that auipc's
        if (full:=hi.get(sym + a)) is None: raise ImageError(f"kernel {name}: %pcrel_lo at {p:#x} has no %pcrel_hi at {sym + a:#x}")
        put32(p, (_itype if t == RV.PCREL_LO12_I else _stype)(u32(p), full - _hi20(full)))
      case RV.RVC_BRANCH:
        fits(off, 9, "c.branch"); struct.pack_into("<H", image, p, _cbtype(struct.unpack_from("<H", image, p)[0], off))
      case RV.RVC_JUMP: fits(off, 12, "c.jump"); struct.pack_into("<H", image, p, _cjtype(struct.unpack_from("<H", image, p)[0], off))
      case RV.ADD32 | RV.SUB32 | RV.ADD64 | RV.SUB64:  # label differences, e.g. in jump tables: position independent
        fmt, sign = "<I" if t in (RV.ADD32, RV.SUB32) else "<Q", 1 if t in (RV.ADD32, RV.ADD64) else -1
        struct.pack_into(fmt, image, p, (struct.unpack_from(fmt, image, p)[0] + sign * (sym + a)) & ((1 << (struct.calcsize(fmt) * 8)) - 1))
      case RV.GOT_HI20: raise ImageError(f"kernel {name}: uses the GOT (a global symbol's address), which a runner image has no table for")
      case RV.R_32 | RV.R_64: raise ImageError(f"kernel {name}: has an absolute address (R_RISCV_{32 if t == 1 else 64}), not position independent")
      case _: raise ImageError(f"kernel {name}: RISC-V relocation type {t}, which host-side relocation does not handle")
  return bytes(image)

def clang_arch(arch:str, cpu:str, features:str) -> str:
  """The arch string for tinygrad's ClangCompiler ("<arch>,<cpu>,<feat>...") for the machine a runner reports in Rhello.
  "native" would mean this host's CPU, not the runner's, so an unknown CPU becomes the arch's baseline plus the reported features."""
  arch = {"amd64": "x86_64", "aarch64": "arm64"}.get(arch.lower(), arch.lower())
  if arch not in ARCH_CODES: raise ImageError(f"runner reports arch {arch!r}; CPU images can be built for {', '.join(ARCH_CODES)}")
  feats = [f.removeprefix("+") for f in re.split(r"[,\s]+", features.strip()) if f.removeprefix("+")]
  return ",".join([arch, cpu if cpu and cpu != "native" else BASELINE_CPU[arch], *feats])

def cpu_image(obj:bytes, name:str) -> tuple[int, bytes, int]:
  """Relocates the ELF object obj at base 0. Returns (proto arch code, image, entry offset of function name in the image)."""
  if obj[:4] != b"\x7fELF" or obj[4] != libc.ELFCLASS64: raise ImageError(f"kernel {name}: not a 64-bit ELF object")
  if (arch:=ELF_MACHINES.get(struct.unpack_from("<H", obj, 18)[0])) is None: raise ImageError(f"kernel {name}: ELF machine is not one a runner has")
  try:
    if arch == "riscv64": sections, image_, relocs = rv_load(obj, name); image = rv_relocate(image_, relocs, name)
    else: _, sections, _ = elf_loader(obj); image = jit_loader(obj, base=0, link_libs=[])
  except NotImplementedError as e: raise ImageError(f"kernel {name}: {e}, which host-side relocation does not handle") from e
  except ImageError: raise
  except RuntimeError as e: raise ImageError(f"kernel {name}: {e} (runner images are self-contained: no libm or libc calls)") from e
  # elf_loader only lays out PROGBITS sections: a kernel with zero-initialised data (.bss) would relocate against address 0
  if (bss:=[s.name for s in sections if s.header.sh_type == libc.SHT_NOBITS and s.header.sh_flags & libc.SHF_ALLOC and s.header.sh_size]):
    raise ImageError(f"kernel {name}: has {', '.join(bss)} sections, which a runner image cannot carry")
  if (symtab:=next((s for s in sections if s.header.sh_type == libc.SHT_SYMTAB), None)) is None: raise ImageError(f"kernel {name}: no symbol table")
  strtab, nsym = sections[symtab.header.sh_link].content, len(symtab.content) // ctypes.sizeof(libc.Elf64_Sym)
  for sym in (libc.Elf64_Sym * nsym).from_buffer_copy(symtab.content):
    if sym.st_info & 0xf != libc.STT_FUNC or sym.st_shndx in (libc.SHN_UNDEF, libc.SHN_ABS) or sym.st_shndx >= len(sections): continue
    if strtab[sym.st_name:strtab.index(b"\0", sym.st_name)] == name.encode():
      if (entry:=sections[sym.st_shndx].header.sh_addr + sym.st_value) >= len(image): raise ImageError(f"kernel {name}: entry outside the image")
      return ARCH_CODES[arch], image, entry
  raise ImageError(f"kernel {name}: no function named {name} in the object")
