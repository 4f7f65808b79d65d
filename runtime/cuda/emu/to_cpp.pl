#!/usr/bin/perl
# A .cu file as C++ for the CUDA emulator (cuda_emu.h): usage to_cpp.pl IN OUT.
#  kernel<<<grid, block, smem, stream>>>(args)  ->  ::ptdp::emu::Launch(kernel, grid, block, smem, stream)(args)
#  extern __shared__ __align__(N) unsigned char name[];  ->  unsigned char* name = <the launch's>;
# The kernel expression is a name (with . or ::) and an optional template argument list without
# nested angle brackets, as every launch in runtime/cuda writes it; anything else left over is an
# error here rather than a confusing one from the compiler.
use strict;
use warnings;
my ($in, $out) = @ARGV;
open(my $fh, '<', $in) or die "to_cpp.pl: cannot read $in: $!\n";
local $/;
my $s = <$fh>;
close($fh);
# The newlines a launch spans are kept after it, so that #line keeps the compiler's line numbers.
sub keep_lines { my $n = () = $_[0] =~ /\n/g; return "\n" x $n; }
my $launches = ($s =~ s/([A-Za-z_][\w.:]*(?:<[^<>;{}()]*>)?)(\s*<<<(.*?)>>>\s*)\(/"::ptdp::emu::Launch($1, $3)(" . keep_lines($2)/gse);
my $shared = ($s =~ s/extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?unsigned\s+char\s+(\w+)\[\]\s*;/unsigned char* $1 = ::ptdp::emu::detail::DynamicShared();/g);
die "to_cpp.pl: $in: a kernel launch left unconverted\n" if $s =~ /<<<|>>>/;
die "to_cpp.pl: $in: an extern __shared__ declaration left unconverted\n" if $s =~ /extern\s+__shared__/;
$launches ||= 0;
$shared ||= 0;
open(my $oh, '>', "$out.tmp") or die "to_cpp.pl: cannot write $out: $!\n";
print $oh "// Generated from $in by runtime/cuda/emu/to_cpp.pl ($launches launches, $shared dynamic shared arrays).\n";
print $oh "#line 1 \"$in\"\n";
print $oh $s;
close($oh) or die "to_cpp.pl: cannot write $out: $!\n";
rename("$out.tmp", $out) or die "to_cpp.pl: cannot write $out: $!\n";
