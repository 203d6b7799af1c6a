#!/bin/bash
# usage: build.sh d fixed|varlen [causal] [srcroot]
d=$1; mode=$2; c=${3:-dense}; src=${4:-/work/main/src}
name=d${d}_${c}_${mode}${TAG}
out=/tmp/sass_varlen/ptx_$name
rm -rf $out; mkdir -p $out
cd ${RUNDIR:-/work/main} && CUTE_DSL_ARCH=sm_90a CUTE_DSL_KEEP_PTX=1 CUTE_DSL_LINEINFO=${LINEINFO:-0} CUTE_DSL_DUMP_DIR=$out PYTHONPATH=$src /work/venv/bin/python /tmp/sass_varlen/scripts/compile.py $d $mode $c > /tmp/sass_varlen/$name.log 2>&1
ls $out
