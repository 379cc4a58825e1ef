# owdisplay FILE [--mime TYPE] [--id ID]: shows a file of the box in the notebook. Every shell of the
# kernel defines it (bash.py reads this file into the shell's start-up, @TYPES_CASE@ and @TYPES_LIST@
# filled in with the types it takes). It prints one line the shell's reader takes out of the output
# (mime TAB id TAB path, after DISPLAY_START); the kernel checks again what it is asked to show.
owdisplay() {
  local mime= id= path= usage='usage: owdisplay FILE [--mime TYPE] [--id ID]'
  while [ $# -gt 0 ]; do
    case $1 in
      --mime) mime=$2; shift 2 || return 2;; --mime=*) mime=${1#*=}; shift;;
      --id) id=$2; shift 2 || return 2;; --id=*) id=${1#*=}; shift;;
      -h|--help) echo "$usage"; echo 'Shows FILE (png, jpeg, gif, svg, html, markdown, json, text) in the notebook;'\
 'a later call with the same --id replaces that output. HTML shows in a frame where no script runs,'\
 "Markdown's raw HTML as text. --mime takes: @TYPES_LIST@."; return 0;;
      -*) echo "owdisplay: unknown option $1" >&2; echo "$usage" >&2; return 2;;
      *) if [ -n "$path" ]; then echo "owdisplay: one file at a time" >&2; return 2; fi; path=$1; shift;;
    esac
  done
  [ -n "$path" ] || { echo "$usage" >&2; return 2; }
  mime=${mime,,}
  case $mime in
    ''|@TYPES_CASE@) ;;
    *) echo "owdisplay: type '$mime' is not shown (it could run code in the notebook's page);"\
 "--mime takes: @TYPES_LIST@" >&2; return 2;;
  esac
  [ -f "$path" ] || { echo "owdisplay: no such file: $path" >&2; return 1; }
  case $path in /*) ;; *) path=$PWD/$path;; esac
  printf '\037\035OWD:%s\t%s\t%s\n' "$mime" "$id" "$path"
}
export -f owdisplay
