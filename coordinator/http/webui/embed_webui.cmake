# cmake -DIN=index.html -DOUT=webui_page.cpp -P embed_webui.cmake
# Writes a C++ source with the page's bytes (moe::http::webui::kIndexHtml, kIndexHtmlSize) and its
# Content-Security-Policy (kContentSecurityPolicy), which allows the page's one inline <style> and
# one inline <script> by their SHA-256 hashes, computed here from the exact bytes between the tags.
# Run by coordinator/http/CMakeLists.txt whenever index.html (or this script) changes.
cmake_minimum_required(VERSION 3.20)
if(NOT IN OR NOT OUT)
  message(FATAL_ERROR "usage: cmake -DIN=index.html -DOUT=webui_page.cpp -P embed_webui.cmake")
endif()

# The base64 of a 64-digit hex SHA-256 (CSP's 'sha256-...' form).
function(hex_to_base64 hex out)
  set(alphabet "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
  string(LENGTH "${hex}" n)
  set(b64 "")
  set(i 0)
  while(i LESS n)
    math(EXPR left "${n} - ${i}")
    if(left GREATER_EQUAL 6)
      set(take 6)
    else()
      set(take ${left})
    endif()
    string(SUBSTRING "${hex}" ${i} ${take} group)
    # Pad the last group to 3 bytes; its missing sextets become '='.
    set(pad "")
    if(take EQUAL 4)
      set(group "${group}00")
      set(pad "=")
    elseif(take EQUAL 2)
      set(group "${group}0000")
      set(pad "==")
    endif()
    math(EXPR v "0x${group}")
    set(chars "")
    foreach(shift 18 12 6 0)
      math(EXPR idx "(${v} >> ${shift}) & 63")
      string(SUBSTRING "${alphabet}" ${idx} 1 c)
      string(APPEND chars "${c}")
    endforeach()
    string(LENGTH "${pad}" npad)
    if(npad GREATER 0)
      math(EXPR keep "4 - ${npad}")
      string(SUBSTRING "${chars}" 0 ${keep} chars)
      string(APPEND chars "${pad}")
    endif()
    string(APPEND b64 "${chars}")
    math(EXPR i "${i} + 6")
  endwhile()
  set(${out} "${b64}" PARENT_SCOPE)
endfunction()

# The CSP source 'sha256-...' of the text between `open` and `close`; the page must hold exactly
# one such element.
function(inline_hash text open close out)
  string(FIND "${text}" "${open}" a)
  string(FIND "${text}" "${open}" a_last REVERSE)
  string(FIND "${text}" "${close}" b)
  if(a LESS 0 OR b LESS 0 OR NOT a EQUAL a_last)
    message(FATAL_ERROR "${IN}: needs exactly one ${open}...${close} (with no attributes)")
  endif()
  string(LENGTH "${open}" open_len)
  math(EXPR start "${a} + ${open_len}")
  math(EXPR len "${b} - ${start}")
  string(SUBSTRING "${text}" ${start} ${len} body)
  string(SHA256 hex "${body}")
  hex_to_base64("${hex}" b64)
  set(${out} "'sha256-${b64}'" PARENT_SCOPE)
endfunction()

file(READ "${IN}" page)
string(FIND "${page}" "\r" cr)
if(NOT cr EQUAL -1)
  message(FATAL_ERROR "${IN}: use LF line endings (the CSP hashes are of the exact bytes)")
endif()
inline_hash("${page}" "<script>" "</script>" script_hash)
inline_hash("${page}" "<style>" "</style>" style_hash)
string(CONCAT csp "default-src 'none'; script-src ${script_hash}; style-src ${style_hash}; "
       "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")

file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" hex_len)
math(EXPR size "${hex_len} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REPEAT "0x..," 20 line)  # CMake regexes have no {n}
string(REGEX REPLACE "(${line})" "\\1\n" bytes "${bytes}")

file(WRITE "${OUT}.tmp"
"// Generated from coordinator/http/webui/index.html by embed_webui.cmake: do not edit.
#include <cstddef>

namespace moe::http::webui {

extern const unsigned char kIndexHtml[];
extern const size_t kIndexHtmlSize;
extern const char kContentSecurityPolicy[];

const unsigned char kIndexHtml[] = {
${bytes}
};
const size_t kIndexHtmlSize = ${size};
const char kContentSecurityPolicy[] =
    \"${csp}\";

}  // namespace moe::http::webui
")
# Replaced only when different, so an unchanged page does not recompile.
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
