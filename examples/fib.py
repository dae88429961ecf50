def fibonacci(n):
    


def main():
    for i in range(10):
        print(i, fibonacci(i))
