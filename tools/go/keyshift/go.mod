module keyshift.local/keyshift

go 1.19
