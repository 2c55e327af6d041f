#!/usr/bin/perl
# api/openapi.yaml as a third party reads it: JSON::Validator (Debian's
# libjson-validator-perl) lints it against the OpenAPI 3.0 meta-schema, and
# OpenAPI::Client (libopenapi-client-perl) generates a client from it, one
# method per operationId, that drives a real loomd on loopback: submit, list,
# get, cancel and follow events, then every read route. Each request is
# built and checked against the spec by the client; each reply is checked
# against the operation's declared response with validate_response.
# Usage: test_openapi_client.pl BIN_DIR OPENAPI_YAML. Exit 0 pass, 1 fail, 77 skip.
use strict;
use warnings;
use File::Temp qw(tempdir);
use POSIX qw(WNOHANG);
use Time::HiRes qw(sleep);

eval { require JSON::Validator; require OpenAPI::Client; 1 }
  or do { print "SKIP: libopenapi-client-perl not installed\n"; exit 77 };

my ($bin, $yaml) = @ARGV;
my $fails = 0;
sub check {
    my ($ok, $what) = @_;
    print(($ok ? "ok" : "FAIL"), " - $what\n");
    $fails++ unless $ok;
    return $ok;
}

# 1. The linter: the spec is valid OpenAPI 3.0.
my $schema = JSON::Validator->new->schema($yaml)->schema;
$schema->coerce({}); # replies are checked as sent: a number where a string is declared fails
check(ref($schema) eq 'JSON::Validator::Schema::OpenAPIv3', "read as OpenAPI v3: " . ref $schema);
my @errs = @{ $schema->errors };
unless (check(!@errs, "api/openapi.yaml is valid against the OpenAPI 3.0 schema")) {
    print "  $_\n" for @errs[0 .. ($#errs < 20 ? $#errs : 20)];
}
exit 1 if @errs;

# 2. A real loomd.
my $dir   = tempdir(CLEANUP => 1);
my $admin = "openapi-admin-token";
my $pid   = fork // die "fork: $!";
if (!$pid) {
    $ENV{LOOM_ADMIN_TOKEN} = $admin;
    $ENV{LOOM_JOIN_TOKEN}  = "openapi-join-token";
    open STDOUT, '>', "$dir/loomd.log";
    open STDERR, '>&', \*STDOUT;
    exec "$bin/loomd", "--listen", "127.0.0.1:0", "--data-dir", "$dir/data",
      "--store-sync-full", "false";
    die "exec: $!";
}
my $addr;
for (1 .. 100) {
    if (open my $f, '<', "$dir/data/loomd.addr") { $addr = <$f>; last if $addr; }
    sleep 0.1;
}
END { if ($pid) { kill 'TERM', $pid; waitpid $pid, 0; } }
chomp $addr if $addr;
check($addr, "loomd up at " . ($addr // "?")) or exit 1;
my $base = $addr =~ m{^http} ? $addr : "http://$addr";

my $client = OpenAPI::Client->new("file://" . File::Spec->rel2abs($yaml), base_url => $base);
my $token = $admin;
$client->ua->on(start => sub { $_[1]->req->headers->authorization("Bearer $token") });
$client->ua->request_timeout(30);

# Calls operation $op and checks the reply against the spec; returns the tx.
sub call {
    my ($op, $params, $want) = @_;
    my $tx = $client->call($op, $params // {});
    my $res = $tx->res;
    my $code = $res->code // 0;
    check($code == $want, "$op: HTTP $code (want $want)" .
          ($code == $want ? "" : " " . substr($res->body // "", 0, 300)));
    my $route = $client->validator->routes->first(sub { ($_->{operation_id} // '') eq $op });
    my $ct = ($res->headers->content_type // '') =~ s/;.*//r;
    # The linter's schema object, which coerces nothing (the client's own
    # validator coerces types to build requests).
    my @verr = $schema->validate_response(
        [$route->{method}, $route->{path}, $code],
        {body => sub { {exists => 1, content_type => $ct,
                        value => $ct eq 'application/json' ? $res->json : $res->body} },
         header => sub { my $v = $res->headers->header($_[0]); {exists => defined $v, value => $v} }});
    print "  $_\n" for @verr;
    check(!@verr, "$op: reply matches the declared $code response");
    return $tx;
}

my $t = call('createTenant', {body => {name => 'openapi'}}, 201)->res->json;
my $k = call('createTenantToken', {id => $t->{id}, body => {}}, 201)->res->json;
$token = $k->{token};
open my $df, '>', "$dir/train.bin" or die;
print $df "\0" x 4096;
close $df;
my $spec = {
    name     => 'openapi-client',
    model    => {family => 'gpt2', n_layer => 2, n_head => 2, d_model => 64, d_ff => 256,
                 vocab_size => 256, seq_len => 32},
    data     => {train => "$dir/train.bin"},
    parallel => {dp => 1},
    train    => {steps => 1, global_batch_tokens => 128, micro_batch => 4, precision => 'fp32'},
    resources => {device => 'cpu', gpus_per_node => 1},
};
my $job = call('submitJob', {body => $spec}, 201)->res->json;
check($job->{id} && $job->{state} eq 'queued', "submitted $job->{id}");
my $list = call('listJobs', {}, 200)->res->json;
check((grep { $_->{id} eq $job->{id} } @{ $list->{items} }), "listJobs has the job");
check(call('getJob', {id => $job->{id}}, 200)->res->json->{name} eq 'openapi-client', "getJob");
my $ev = call('listEvents', {since => 0, job => $job->{id}}, 200)->res->json;
check(@{ $ev->{items} } == 1 && $ev->{items}[0]{type} eq 'job.queued', "listEvents: job.queued");
my $next = $ev->{next};
check(call('cancelJob', {id => $job->{id}}, 200)->res->json->{state} =~ /^cancel/, "cancelJob");
# Follow: a long-poll from the cursor returns the cancel.
$ev = call('listEvents', {since => $next, job => $job->{id}, wait => 10}, 200)->res->json;
check(@{ $ev->{items} } && $ev->{items}[-1]{type} eq 'job.cancelled', "listEvents follows to job.cancelled");
# Every read route a tenant may use, and the errors they declare.
call('listJobEvents', {id => $job->{id}}, 200);
call('getJobMetrics', {id => $job->{id}}, 200);
call('listArtifacts', {id => $job->{id}}, 200);
call('listNodes', {}, 200);
call('listNodeChecks', {}, 200);
call('getUsage', {}, 200);
call('getPrices', {}, 200);
call('listWebhooks', {}, 200);
call('getJob', {id => 'j-000000000000'}, 404);
call('listEvents', {type => 'job.nope'}, 400);
call('downloadArtifact', {id => $job->{id}, path => 'export/hf/none'}, 404);
call('getHealth', {}, 200);
$token = 'not-a-token';
call('listJobs', {}, 401);
exit($fails ? 1 : 0);
