/* The constants of bm_exp (tensor.c): shared with the vector form of the kernels (kernels_vexp.h),
 * which must compute exactly the same operations on exactly the same numbers. */
#ifndef BMOE_EXP_POLY_H
#define BMOE_EXP_POLY_H

/* x = n ln2 + r, |r| <= ln2/2; ln2 split so that n * BM_EXP_LN2_HI is exact (Cody-Waite). */
#define BM_EXP_LN2_HI 6.93147180369123816490e-01
#define BM_EXP_LN2_LO 1.90821492927058770002e-10
#define BM_EXP_INV_LN2 1.44269504088896338700e+00

/* exp(r) as the Taylor series to r^14 in Horner form, with the coefficients 1/k! written out (no
 * division: this runs for every SiLU and softmax element). Index k holds 1/k!. */
#define BM_EXP_DEGREE 14
#define BM_EXP_INV_FACT                                                                                     \
    {                                                                                                       \
        1.0, 1.0, 0.5, 0.16666666666666666, 0.041666666666666664, 0.0083333333333333332,                   \
            0.0013888888888888889, 0.00019841269841269841, 2.4801587301587302e-05, 2.7557319223985893e-06, \
            2.7557319223985888e-07, 2.505210838544172e-08, 2.08767569878681e-09, 1.6059043836821613e-10,   \
            1.1470745597729725e-11,                                                                         \
    }

#endif
