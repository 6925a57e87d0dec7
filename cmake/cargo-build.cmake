# The build step of fmha's CMakeLists.txt (cmake -P; the variables below come as -D): builds the
# library with cargo and stages it in the installed layout, with what linking it takes.
#
#   CARGO, READELF     the tools
#   SOURCE_DIR         fmha's source directory (Cargo.toml)
#   TARGET_DIR         cargo's target directory
#   PROFILE            the cargo profile (dev, release, ...)
#   BACKEND, FEATURES  host, cuda or rocm; the cargo features ("" for host)
#   VERSION, SONAME    the package version (file names) and the soname build.rs must have set
#   STAGE_DIR          where it all goes:
#     lib/libfmha.so.VERSION, lib/SONAME -> it, lib/libfmha.so -> SONAME, lib/libfmha.a, include/fmha.h
#     static-link.rsp  the linker options a static link of libfmha.a needs (fmha::static)
#     shared-link.rsp  -rpath-link to a GPU runtime outside the linker's default paths (fmha::shared)
#     build-info.cmake what cmake/install-package.cmake writes into the package files
#
# How the static library's native dependencies are found: the library is built with
#   cargo rustc --lib --crate-type cdylib,staticlib -- --print native-static-libs
# rustc then prints the linker flags a static link of libfmha.a needs (e.g. for the host backend
# `-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc`; cuda adds `-ldl -lrt -lpthread`, rocm `-lamdhip64
# -lstdc++`). Cargo replays that note when the build is already fresh. Directories of those
# libraries outside the linker's default paths (e.g. /opt/rocm/lib), taken from the build script's
# rustc-link-search lines, are added as -L flags.
cmake_minimum_required(VERSION 3.19)

foreach(var IN ITEMS CARGO READELF SOURCE_DIR TARGET_DIR PROFILE BACKEND VERSION SONAME STAGE_DIR)
  if("${${var}}" STREQUAL "")
    message(FATAL_ERROR "cargo-build.cmake: -D${var}=... is required")
  endif()
endforeach()

set(ENV{CARGO_TARGET_DIR} "${TARGET_DIR}")
set(cargo_args rustc --manifest-path "${SOURCE_DIR}/Cargo.toml" --lib --profile "${PROFILE}" --color never)
if(NOT FEATURES STREQUAL "")
  list(APPEND cargo_args --features "${FEATURES}")
endif()
# stdout: JSON messages (artifacts, build script output); stderr: the rendered compiler messages,
# shown as they come and kept to find the native-static-libs note.
list(APPEND cargo_args --crate-type cdylib,staticlib --message-format=json-render-diagnostics
                       -- --print native-static-libs)
file(MAKE_DIRECTORY "${STAGE_DIR}/lib" "${STAGE_DIR}/include")
set(messages "${STAGE_DIR}/cargo-messages.json")

list(JOIN cargo_args " " shown)
message(STATUS "fmha: CARGO_TARGET_DIR=${TARGET_DIR} cargo ${shown}")
execute_process(
  COMMAND "${CARGO}" ${cargo_args}
  WORKING_DIRECTORY "${SOURCE_DIR}"
  OUTPUT_FILE "${messages}"
  ERROR_VARIABLE cargo_stderr
  ECHO_ERROR_VARIABLE
  RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "fmha: cargo failed (${status}); its messages are above")
endif()

# json_strings(OUT JSON KEY): the strings of the array KEY of the object JSON, as a list.
function(json_strings out json key)
  set(values "")
  string(JSON count LENGTH "${json}" ${key})
  if(count GREATER 0)
    math(EXPR last "${count} - 1")
    foreach(i RANGE ${last})
      string(JSON value GET "${json}" ${key} ${i})
      list(APPEND values "${value}")
    endforeach()
  endif()
  set(${out} "${values}" PARENT_SCOPE)
endfunction()

# The library's files and its build script's output directory (the generated header) and link
# search paths, from cargo's JSON messages.
set(shared_lib "")
set(static_lib "")
set(out_dir "")
set(linked_paths "")
# One message a line, taken with string(FIND) rather than as a CMake list, which a [ or ; in a
# path would split wrongly.
file(READ "${messages}" rest)
while(NOT rest STREQUAL "")
  string(FIND "${rest}" "\n" end)
  if(end EQUAL -1)
    set(line "${rest}")
    set(rest "")
  else()
    string(SUBSTRING "${rest}" 0 ${end} line)
    math(EXPR end "${end} + 1")
    string(SUBSTRING "${rest}" ${end} -1 rest)
  endif()
  if(NOT line MATCHES "\"reason\":\"(compiler-artifact|build-script-executed)\"")
    continue()
  endif()
  string(JSON reason GET "${line}" reason)
  if(reason STREQUAL "compiler-artifact")
    json_strings(files "${line}" filenames)
    foreach(file IN LISTS files)
      if(file MATCHES "/libfmha\\.so$")
        set(shared_lib "${file}")
      elseif(file MATCHES "/libfmha\\.a$")
        set(static_lib "${file}")
      endif()
    endforeach()
  else()
    string(JSON dir GET "${line}" out_dir)
    if(dir MATCHES "/build/fmha-[^/]*/out$")
      set(out_dir "${dir}")
      json_strings(paths "${line}" linked_paths)
      list(TRANSFORM paths REPLACE "^[a-z]+=" "") # native=/dir, all=/dir, ...
      set(linked_paths "${paths}")
    endif()
  endif()
endwhile()

string(REGEX MATCHALL "native-static-libs: [^\n]*" notes "${cargo_stderr}")
list(POP_BACK notes native_libs)
string(REGEX REPLACE "^native-static-libs: *" "" native_libs "${native_libs}")
string(STRIP "${native_libs}" native_libs)

foreach(what IN ITEMS shared_lib static_lib out_dir native_libs)
  if("${${what}}" STREQUAL "")
    message(FATAL_ERROR "fmha: could not determine ${what} from cargo's output (${messages} and the messages above)")
  endif()
endforeach()
set(header "${out_dir}/fmha.h")
if(NOT EXISTS "${header}")
  message(FATAL_ERROR "fmha: the generated header ${header} is missing")
endif()
if(EXISTS "${SOURCE_DIR}/include/fmha.h")
  file(SHA256 "${header}" generated_sum)
  file(SHA256 "${SOURCE_DIR}/include/fmha.h" committed_sum)
  if(NOT generated_sum STREQUAL committed_sum)
    message(WARNING "fmha: include/fmha.h differs from the generated header; using the generated one "
                    "(refresh it: cp '${header}' '${SOURCE_DIR}/include/fmha.h')")
  endif()
endif()

execute_process(COMMAND "${READELF}" -d "${shared_lib}" OUTPUT_VARIABLE dynamic RESULT_VARIABLE status)
set(soname "")
if(status EQUAL 0 AND dynamic MATCHES "Library soname: \\[([^]\n]*)\\]")
  set(soname "${CMAKE_MATCH_1}")
endif()
if(NOT soname STREQUAL SONAME)
  message(FATAL_ERROR "fmha: the soname of ${shared_lib} is '${soname}', expected ${SONAME} "
                      "(build.rs and Cargo.toml's major version disagree)")
endif()

# -L for the directories (from the build script's link-search lines) that hold a library named by
# native_libs and are not a default linker path nor a build directory.
separate_arguments(native_flags UNIX_COMMAND "${native_libs}")
get_filename_component(profile_dir "${shared_lib}" DIRECTORY)
get_filename_component(build_root "${profile_dir}" DIRECTORY)
set(dep_dirs "")
foreach(path IN LISTS linked_paths)
  string(FIND "${path}/" "${build_root}/" at)
  if(at EQUAL 0 OR path MATCHES "^(/usr)?/lib(64|/x86_64-linux-gnu)?$")
    continue()
  endif()
  foreach(flag IN LISTS native_flags)
    if(flag MATCHES "^-l(.+)$")
      file(GLOB found "${path}/lib${CMAKE_MATCH_1}.so*")
      if(found)
        list(APPEND dep_dirs "${path}")
        break()
      endif()
    endif()
  endforeach()
endforeach()
set(static_flags "")
foreach(dir IN LISTS dep_dirs)
  list(APPEND static_flags "-L${dir}")
endforeach()
list(APPEND static_flags ${native_flags})

# Stage the files. Compared by content, not time: a switch of profile, backend or target directory
# may stage an older build; an unchanged file keeps its time stamp, so consumers relink only when
# the library changed.
function(stage from to)
  execute_process(COMMAND "${CMAKE_COMMAND}" -E copy_if_different "${from}" "${to}" COMMAND_ERROR_IS_FATAL ANY)
endfunction()
stage("${shared_lib}" "${STAGE_DIR}/lib/libfmha.so.${VERSION}")
stage("${static_lib}" "${STAGE_DIR}/lib/libfmha.a")
stage("${header}" "${STAGE_DIR}/include/fmha.h")
file(CREATE_LINK "libfmha.so.${VERSION}" "${STAGE_DIR}/lib/${SONAME}" SYMBOLIC)
file(CREATE_LINK "${SONAME}" "${STAGE_DIR}/lib/libfmha.so" SYMBOLIC)

# Response files for `-Wl,@file`: one linker argument per line, quoted for ld's parser.
function(write_rsp file)
  set(text "")
  foreach(arg IN LISTS ARGN)
    string(REPLACE "\\" "\\\\" arg "${arg}")
    string(REPLACE "\"" "\\\"" arg "${arg}")
    string(APPEND text "\"${arg}\"\n")
  endforeach()
  file(WRITE "${file}" "${text}")
endfunction()
write_rsp("${STAGE_DIR}/static-link.rsp" ${static_flags})
set(rpath_links "")
foreach(dir IN LISTS dep_dirs)
  list(APPEND rpath_links "-rpath-link=${dir}")
endforeach()
write_rsp("${STAGE_DIR}/shared-link.rsp" ${rpath_links})

# The values of the placeholders in cmake/*.in, but the prefix (known at install time).
list(JOIN static_flags " " static_text)
file(WRITE "${STAGE_DIR}/build-info.cmake"
  "set(FMHA_VERSION [==[${VERSION}]==])\n"
  "set(FMHA_BACKEND [==[${BACKEND}]==])\n"
  "set(FMHA_FEATURES [==[${FEATURES}]==])\n"
  "set(FMHA_SONAME [==[${SONAME}]==])\n"
  "set(FMHA_STATIC_LIBS_TEXT [==[${static_text}]==])\n"
  "set(FMHA_STATIC_LIBS_CMAKE [==[${static_flags}]==])\n"
  "set(FMHA_DEP_LIB_DIRS_CMAKE [==[${dep_dirs}]==])\n")
