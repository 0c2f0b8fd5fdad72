# Install-time script (CMakeLists.txt): ctbench/_prebuilt/manifest.json from the installed
# libraries.  The manifest is written last, to a temporary name and renamed, so a folder
# with a manifest always holds the bytes it records.
set(_entries "")
foreach(item IN LISTS CTBENCH_LIBS)
  string(REPLACE "|" ";" parts "${item}")
  list(GET parts 0 family)
  list(GET parts 1 variant)
  list(GET parts 2 file)
  list(GET parts 3 flags)
  set(path "${CTBENCH_DEST}/${file}")
  file(SHA256 "${path}" sha)
  file(SIZE "${path}" size)
  string(REPLACE "\"" "\\\"" flags "${flags}")
  list(APPEND _entries "  {\"family\": \"${family}\", \"variant\": \"${variant}\", \"file\": \"${file}\", \"size\": ${size}, \"sha256\": \"${sha}\", \"flags\": \"${flags}\"}")
endforeach()
string(REPLACE ";" ",\n" _entries "${_entries}")
set(_srcs "")
foreach(src IN LISTS CTBENCH_SOURCES)
  file(SHA256 "${CTBENCH_SOURCE_DIR}/${src}" sha)
  list(APPEND _srcs "  \"${src}\": \"${sha}\"")
endforeach()
string(REPLACE ";" ",\n" _srcs "${_srcs}")
file(WRITE "${CTBENCH_DEST}/manifest.json.tmp"
  "{\"format\": \"ctbench.prebuilt-kernels\", \"version\": 1, \"machine\": \"${CTBENCH_MACHINE}\",\n"
  " \"compiler\": \"${CTBENCH_COMPILER}\",\n \"libraries\": [\n${_entries}\n ],\n \"sources\": {\n${_srcs}\n }}\n")
file(RENAME "${CTBENCH_DEST}/manifest.json.tmp" "${CTBENCH_DEST}/manifest.json")
message(STATUS "ctbench: wrote ${CTBENCH_DEST}/manifest.json")
