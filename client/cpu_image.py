# cpu_image.py: turn clang's ELF object for one tinygrad kernel into the image a CPU runner loads (PROTO_PROG_CPU_IMAGE)
# The image is relocated on the host at base 0 with no libraries: kernel code is position independent and only has PC-relative
# relocations, so the runner maps the bytes anywhere and calls image+entry. Anything that would need the host's address space is an error.
import ctypes, re, struct
from tinygrad.runtime.autogen import libc
from tinygrad.runtime.support.elf import elf_loader, jit_loader
from client.protocol import ARCHS

ARCH_CODES = {name: code for code, name in ARCHS.items()}
ELF_MACHINES = {libc.EM_X86_64: "x86_64", libc.EM_AARCH64: "arm64", libc.EM_RISCV: "riscv64"}
BASELINE_CPU = {"x86_64": "x86-64", "arm64": "generic", "riscv64": "rv64g"}

class ImageError(RuntimeError): pass

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
    _, sections, _ = elf_loader(obj)
    image = jit_loader(obj, base=0, link_libs=[])
  except NotImplementedError as e: raise ImageError(f"kernel {name}: {e}, which host-side relocation does not handle") from e
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
