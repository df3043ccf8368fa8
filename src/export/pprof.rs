//! pprof profiles (`profile.proto`, gzipped) of an analysis: prost messages of our own,
//! written so that `go tool pprof` reads them.
