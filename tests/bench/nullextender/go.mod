module gpuwarden.io/bench/nullextender

go 1.26
