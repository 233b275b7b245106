// `deltaserve serve`: every role of a one-host cluster as child processes of this binary
// (scheduler, worker, gateway), for the quick start and for local serving.
// `deltaserve gateway`: the gateway role alone.
#pragma once

namespace ds {

int RunServe(int argc, char** argv);
int RunGateway(int argc, char** argv);

}  // namespace ds
