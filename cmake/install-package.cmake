# Install step of fmha's CMakeLists.txt (install(SCRIPT); _fmha_templates and _fmha_stage are set
# before it): renders cmake/fmhaConfig.cmake.in, fmhaConfigVersion.cmake.in and fmha.pc.in with the
# values the build step recorded (stage/build-info.cmake) and the install prefix, and installs them.

if(NOT EXISTS "${_fmha_stage}/build-info.cmake")
  message(FATAL_ERROR "fmha is not built (${_fmha_stage}/build-info.cmake is missing): run cmake --build first")
endif()
include("${_fmha_stage}/build-info.cmake")
set(PREFIX "${CMAKE_INSTALL_PREFIX}")

function(_fmha_render template output)
  file(READ "${_fmha_templates}/${template}" text)
  # configure_file would turn a placeholder without a value into "": stop instead.
  string(REGEX MATCHALL "@[A-Za-z_]+@" placeholders "${text}")
  foreach(placeholder IN LISTS placeholders)
    string(REPLACE "@" "" name "${placeholder}")
    if(NOT DEFINED ${name})
      message(FATAL_ERROR "fmha: ${template} has the placeholder ${placeholder}, which has no value")
    endif()
  endforeach()
  string(CONFIGURE "${text}" text @ONLY)
  file(WRITE "${_fmha_stage}/package/${output}" "${text}")
endfunction()

_fmha_render(fmhaConfig.cmake.in fmhaConfig.cmake)
_fmha_render(fmhaConfigVersion.cmake.in fmhaConfigVersion.cmake)
_fmha_render(fmha.pc.in fmha.pc)
file(INSTALL "${_fmha_stage}/package/fmhaConfig.cmake" "${_fmha_stage}/package/fmhaConfigVersion.cmake"
     DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/cmake/fmha")
file(INSTALL "${_fmha_stage}/package/fmha.pc" DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/pkgconfig")
