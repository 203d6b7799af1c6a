#!/bin/bash
name=$1
cd /tmp/sass_varlen
f=$(ls ptx_$name/*.ptx | head -1)
cp "$f" $name.ptx
ptxas -arch=sm_90a -v $name.ptx -o $name.cubin 2> $name.ptxas.log
/tmp/analysis_varlen/nvdisasm -c $name.cubin > $name.sass
/tmp/analysis_varlen/nvdisasm -c -g -gi $name.cubin > $name.lines.sass 2>/dev/null || true
grep -E "registers|spill" $name.ptxas.log
