module github.com/idalloc/idalloc/clients/go

go 1.19
